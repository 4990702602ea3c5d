"""How a worker process is started: the bubblewrap or plain-subprocess command line.

Both run the standard-library-only ``worker`` package with the base interpreter in isolated mode
(``-I -S``: no environment variables, no site-packages), a clean environment and a private
temp folder. bubblewrap adds namespaces: no network, its own PID space, a tmpfs /tmp, and a root
file system holding only read-only system libraries, the Python standard library and the worker.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .cgroups import alive, sweep_stale_groups
from .result import SandboxError

log = logging.getLogger(__name__)

WORKER_PACKAGE = Path(__file__).resolve().parent / "worker"
BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from worker.main import main; sys.exit(main(sys.argv[2]))"
_INSIDE_LIB = "/skyrl/lib"
_INSIDE_INBOX = "/skyrl/inbox"
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class LaunchPlan:
    """A worker command line plus the paths the worker sees (which differ from the host's under bwrap)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    inside_tmp: str
    inside_inbox: str
    inside_read_roots: tuple[str, ...]


def python_executable() -> str:
    """The base interpreter (not a venv's wrapper), so the worker gets no site-packages."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def clean_env(tmp_dir: str) -> dict[str, str]:
    """The worker's whole environment: nothing from the parent (no API keys, no tokens)."""
    # Few malloc arenas: each reserves 64 MB of address space, which RLIMIT_AS would count per thread.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp_dir, "TMPDIR": tmp_dir, "LANG": "C.UTF-8",
            "MALLOC_ARENA_MAX": "2"}


def _python_args(lib_dir: str, spawn: dict) -> list[str]:
    return [python_executable(), "-I", "-S", "-B", "-X", "utf8", "-c", BOOTSTRAP, lib_dir, json.dumps(spawn)]


def plan_subprocess(host_dir: Path, max_message_bytes: int) -> LaunchPlan:
    tmp, inbox = str(host_dir / "tmp"), str(host_dir / "inbox")
    spawn = {"max_message_bytes": max_message_bytes, "expected_parent_pid": os.getpid()}
    return LaunchPlan(argv=_python_args(str(WORKER_PACKAGE.parent), spawn), cwd=tmp, env=clean_env(tmp),
                      inside_tmp=tmp, inside_inbox=inbox, inside_read_roots=(str(WORKER_PACKAGE), inbox))


def plan_bwrap(host_dir: Path, max_message_bytes: int, tmp_size_mb: int) -> LaunchPlan:
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--cap-drop", "ALL", "--uid", "1000", "--gid", "1000", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    read_only = ["/dev", "/"]
    site_packages = os.path.join(os.path.dirname(os.__file__), "site-packages")
    if os.path.isdir(site_packages):
        argv += ["--tmpfs", site_packages]  # hide the base install's third-party packages
        read_only.insert(0, site_packages)
    argv += ["--ro-bind", str(WORKER_PACKAGE), f"{_INSIDE_LIB}/worker",
             "--ro-bind", str(host_dir / "inbox"), _INSIDE_INBOX,
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    # Every tmpfs but /tmp read-only (/dev/shm included): memory in them would count against no limit.
    for path in read_only:
        argv += ["--remount-ro", path]
    argv += ["--chdir", "/tmp", "--"]
    spawn = {"max_message_bytes": max_message_bytes, "expected_parent_pid": None}
    return LaunchPlan(argv=argv + _python_args(_INSIDE_LIB, spawn), cwd=str(host_dir), env=clean_env("/tmp"),
                      inside_tmp="/tmp", inside_inbox=_INSIDE_INBOX,
                      inside_read_roots=(f"{_INSIDE_LIB}/worker", _INSIDE_INBOX))


_PROCESS_DIR_PREFIX = "skyrl-sandboxes-"
_process_dirs: dict[int, Path] = {}


def process_dir() -> Path:
    """This process's folder for worker folders, made on first use after sweeping dead owners' leftovers."""
    pid = os.getpid()
    if pid not in _process_dirs:
        sweep_stale_dirs()
        sweep_stale_groups()
        _process_dirs[pid] = Path(tempfile.mkdtemp(prefix=f"{_PROCESS_DIR_PREFIX}{pid}-"))
        atexit.register(_remove_own_dir, pid, _process_dirs[pid])
    return _process_dirs[pid]


def _remove_own_dir(owner_pid: int, folder: Path) -> None:
    if os.getpid() == owner_pid:  # not from a forked copy exiting
        shutil.rmtree(folder, ignore_errors=True)


def sweep_stale_dirs(root: str | None = None) -> list[Path]:
    """Remove the folders of processes that died without cleaning up (e.g. SIGKILL); returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_PROCESS_DIR_PREFIX}*"):
        owner = folder.name[len(_PROCESS_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def make_host_dir() -> Path:
    """A private folder per worker: ``inbox/`` (parent writes, worker reads) and ``tmp/``."""
    host_dir = Path(tempfile.mkdtemp(prefix="worker-", dir=process_dir()))
    (host_dir / "inbox").mkdir()
    (host_dir / "tmp").mkdir()
    return host_dir


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap can start the interpreter here; else why not (cached per process)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    host_dir = make_host_dir()
    try:
        plan = plan_bwrap(host_dir, 1024, 1)
        argv = plan.argv[: plan.argv.index("--") + 1] + [python_executable(), "-I", "-S", "-c", "print('ok')"]
        done = subprocess.run(argv, cwd=plan.cwd, env=plan.env, capture_output=True, timeout=30)
        if done.returncode != 0 or done.stdout.strip() != b"ok":
            return f"bwrap failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()[-500:]}"
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed: {exc}"
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


REQUIRE_ENV = "SKYRL_SANDBOX"
SUBPROCESS_WARNING = (
    "sandbox backend 'subprocess' is weaker: model code runs as a plain child process guarded by rlimits, "
    "seccomp and an in-process audit policy that determined code can defeat, after which it can read and "
    "write the host's files and reach the network as the user running the trainer. Use it only for trusted "
    "code or where bubblewrap cannot run.")
_warned_subprocess: list[bool] = []


def resolve_backend(requested: str) -> str:
    """The backend to use for ``requested``; 'auto' means bwrap and never silently anything weaker.

    ``SKYRL_SANDBOX=bwrap|subprocess`` requires that backend for every sandbox of the run: a config
    asking for another one, or a required backend that cannot start, is an error.
    """
    required = os.environ.get(REQUIRE_ENV, "").strip()
    if required:
        if required not in ("bwrap", "subprocess"):
            raise SandboxError(f"{REQUIRE_ENV}={required!r} is not a backend of this sandbox (bwrap, subprocess)")
        if requested not in ("auto", required):
            raise SandboxError(f"the config asks for sandbox backend {requested!r} but {REQUIRE_ENV}={required}")
        requested = required
    if requested == "subprocess":
        if not _warned_subprocess:
            _warned_subprocess.append(True)
            log.warning(SUBPROCESS_WARNING)
        return "subprocess"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    raise SandboxError(f"sandbox backend 'bwrap' is not usable here: {problem}. Install bubblewrap (Debian/Ubuntu: "
                       "apt-get install bubblewrap), or opt in to the weaker backend with sandbox.backend=subprocess, "
                       "which does not protect the host's files and network from determined code.")
