"""The backend vocabulary, one probe per backend, and the choice of backend for a sandbox.

- ``bwrap``: bubblewrap namespaces (no network, own PID/user/mount namespaces, read-only minimal
  mounts, capabilities dropped) plus rlimits, cgroups and seccomp;
- ``docker``: a container of a real Docker Engine (no network, read-only root file system,
  capabilities dropped, no-new-privileges, pids/memory/CPU limits, non-root user);
- ``subprocess``: a plain child process with rlimits, seccomp and an in-process audit policy:
  weaker (determined code can defeat the policy), so never chosen unless asked for by name;
- ``auto``: the first of bwrap and docker that works here (among those the caller can use), else
  an error that says what is missing. ``SKYRL_SANDBOX=bwrap|docker|subprocess`` requires one
  backend for every sandbox of a run.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence

from .errors import BackendUnavailable, SandboxError
from .launch import plan_bwrap, probe_program, python_executable
from .limits import Limits

log = logging.getLogger(__name__)

BACKENDS = ("bwrap", "docker", "subprocess")
REQUIRE_ENV = "SKYRL_SANDBOX"
STRONG = ("bwrap", "docker")  # what auto may pick: backends whose boundary holds without the policy
SUBPROCESS_WARNING = (
    "sandbox backend 'subprocess' is weaker: sandboxed code runs as a plain child process with no namespaces, "
    "guarded by rlimits, seccomp and (in Python workers) an in-process audit policy that determined code can "
    "defeat, after which it can read the host's files and reach the network as the user it runs as. Use it only "
    "for trusted code or where neither bubblewrap nor Docker can run.")
_INSTALL_HINT = {
    "bwrap": "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; in containers it also needs user "
             "namespaces)",
    "docker": "install the docker extra (pip install 'skyrl-sandbox[docker]') and start a Docker Engine "
              "(see `skyrl-sandbox doctor`)",
}
_warned_subprocess: list[bool] = []
_PROBE_LIMITS = Limits(tmp_size_mb=1, max_message_mb=1)


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap can start the interpreter here; else why not (cached per process)."""
    from .dirs import make_host_dir

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


def docker_problem() -> str | None:
    """None when a Docker Engine answers here; else why not (asked anew each time: engines come and go)."""
    from .docker_client import engine_problem

    return engine_problem()


def backend_problem(backend: str) -> str | None:
    if backend == "bwrap":
        return bwrap_problem()
    if backend == "docker":
        return docker_problem()
    return None


def resolve_backend(requested: str, usable: Sequence[str] = BACKENDS) -> str:
    """The backend to use for ``requested`` (a backend name or 'auto'), out of those the caller ``usable``.

    Raises :class:`BackendUnavailable` naming what is missing when nothing strong enough can run,
    and never falls back to ``subprocess`` by itself.
    """
    if requested not in (*BACKENDS, "auto"):
        raise SandboxError(f"unknown sandbox backend {requested!r}; choose one of auto, {', '.join(BACKENDS)}")
    required = os.environ.get(REQUIRE_ENV, "").strip()
    if required:
        if required not in BACKENDS:
            raise SandboxError(f"{REQUIRE_ENV}={required!r} is not a sandbox backend ({', '.join(BACKENDS)})")
        if requested not in ("auto", required):
            raise SandboxError(f"the config asks for sandbox backend {requested!r} but {REQUIRE_ENV}={required}")
        requested = required
    if requested != "auto" and requested not in usable:
        raise SandboxError(f"sandbox backend {requested!r} cannot run this program; usable: {', '.join(usable)}")
    if requested == "subprocess":
        if not _warned_subprocess:
            _warned_subprocess.append(True)
            log.warning(SUBPROCESS_WARNING)
        return "subprocess"
    candidates = [requested] if requested != "auto" else [name for name in STRONG if name in usable]
    problems = []
    for name in candidates:
        problem = backend_problem(name)
        if problem is None:
            return name
        problems.append(f"{name}: {problem}")
    hint = "; or ".join(_INSTALL_HINT[name] for name in candidates)
    opt_in = ", or opt in to the weaker backend with backend=subprocess" if "subprocess" in usable else ""
    raise BackendUnavailable(candidates[0], f"sandbox backend {requested!r} is not usable here "
                             f"({'; '.join(problems)}). To fix: {hint}{opt_in}.")
