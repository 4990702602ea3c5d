"""Whether bubblewrap can start a sandbox here (asked once per process: the answer does not change)."""

from __future__ import annotations

import functools
import shutil
import subprocess

from ...dirs import make_host_dir
from ...launch import probe_program, python_executable
from ...limits import Limits
from .plan import plan_bwrap

_PROBE_LIMITS = Limits(tmp_size_mb=1, max_message_mb=1)


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap can start the interpreter here; else why not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    host_dir = make_host_dir()
    try:
        plan = plan_bwrap(probe_program(), host_dir, _PROBE_LIMITS)
        argv = plan.argv[: plan.argv.index("--") + 1] + [python_executable(), "-I", "-S", "-c", "print('ok')"]
        done = subprocess.run(argv, cwd=plan.cwd, env=plan.env, capture_output=True, timeout=30)
        if done.returncode != 0 or done.stdout.strip() != b"ok":
            return f"bwrap failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()[-500:]}"
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed: {exc}"
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
