"""How a worker process is started: what it runs (:class:`WorkerProgram`) and the command line per backend.

A worker runs a standard-library module of a package the caller names, plus this distribution's
in-sandbox runtime (``skyrl_sandbox_runtime``: the framed channel and the kernel calls), with the
base interpreter in isolated mode (``-I -S``: no environment variables, no site-packages), a clean
environment and a private temp folder. bubblewrap adds namespaces: no network, its own PID space, a
tmpfs /tmp, and a root file system holding only read-only system libraries, the Python standard
library, the program's packages and the paths it declares.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .limits import Limits

RUNTIME_PACKAGE = Path(__file__).resolve().parent / "runtime"
RUNTIME_NAME = "skyrl_sandbox_runtime"
INSIDE_LIB = "/skyrl/lib"
INSIDE_INBOX = "/skyrl/inbox"
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def python_executable() -> str:
    """The base interpreter (not a venv's wrapper), so a worker gets no site-packages by accident."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@dataclass(frozen=True)
class WorkerProgram:
    """What a worker runs: ``module.main(spawn_json)`` from ``packages`` (name -> host folder).

    ``read_only`` host paths are visible at the same path inside the sandbox and added to the
    worker's ``sys.path`` when listed in ``python_path`` (e.g. the site-packages holding a
    database driver). Everything else of the host stays invisible with bwrap and Docker.
    """

    module: str
    packages: Mapping[str, Path]
    read_only: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _MODULE.match(self.module):
            raise ValueError(f"WorkerProgram.module must be a dotted module name, got {self.module!r}")
        for name, folder in self.packages.items():
            if not name.isidentifier() or not Path(folder, "__init__.py").is_file():
                raise ValueError(f"WorkerProgram.packages: {name!r} -> {folder} is not a package folder")
        object.__setattr__(self, "key", (self.module, tuple(sorted((n, str(p)) for n, p in self.packages.items())),
                                         self.read_only, self.python_path))

    @property
    def all_packages(self) -> dict[str, Path]:
        return {RUNTIME_NAME: RUNTIME_PACKAGE, **{name: Path(path) for name, path in self.packages.items()}}

    def bootstrap(self) -> str:
        return (f"import sys; sys.path[:0] = sys.argv[1].split('\\n'); from {self.module} import main; "
                "sys.exit(main(sys.argv[2]))")


def probe_program() -> WorkerProgram:
    """A program that only needs the runtime (used to probe whether a backend starts at all)."""
    return WorkerProgram(module=f"{RUNTIME_NAME}.kernel", packages={})


@dataclass(frozen=True)
class LaunchPlan:
    """A worker command line plus the paths the worker sees (which differ from the host's under bwrap)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    inside_tmp: str
    inside_inbox: str
    inside_read_roots: tuple[str, ...]


def clean_env(tmp_dir: str) -> dict[str, str]:
    """The worker's whole environment: nothing from the parent (no API keys, no tokens)."""
    # Few malloc arenas: each reserves 64 MB of address space, which RLIMIT_AS would count per thread.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": tmp_dir, "TMPDIR": tmp_dir, "LANG": "C.UTF-8",
            "MALLOC_ARENA_MAX": "2"}


def spawn_settings(limits: Limits, expected_parent_pid: int | None) -> str:
    return json.dumps({"max_message_bytes": limits.max_message_bytes, "expected_parent_pid": expected_parent_pid})


def python_args(program: WorkerProgram, interpreter: str, lib_dirs: list[str], spawn: str) -> list[str]:
    return [interpreter, "-I", "-S", "-B", "-X", "utf8", "-c", program.bootstrap(),
            "\n".join([*lib_dirs, *program.python_path]), spawn]


def plan_subprocess(program: WorkerProgram, host_dir: Path, limits: Limits) -> LaunchPlan:
    tmp, inbox, lib = str(host_dir / "tmp"), str(host_dir / "inbox"), host_dir / "lib"
    lib.mkdir(exist_ok=True)
    for name, folder in program.all_packages.items():
        (lib / name).symlink_to(folder, target_is_directory=True)
    spawn = spawn_settings(limits, os.getpid())
    read_roots = tuple(str(folder) for folder in program.all_packages.values()) + program.read_only + (inbox,)
    return LaunchPlan(argv=python_args(program, python_executable(), [str(lib)], spawn), cwd=tmp, env=clean_env(tmp),
                      inside_tmp=tmp, inside_inbox=inbox, inside_read_roots=read_roots)


def bwrap_base_argv(uid: int, hostname: str) -> list[str]:
    """bubblewrap with fresh namespaces, no capabilities, ``uid`` inside, and the host's system folders read-only."""
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--cap-drop", "ALL", "--uid", str(uid), "--gid", str(uid),
            "--hostname", hostname, "--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def plan_bwrap(program: WorkerProgram, host_dir: Path, limits: Limits) -> LaunchPlan:
    argv = [*bwrap_base_argv(1000, "sandbox"), "--new-session",
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    # /proc too: the sandbox's uid maps to the host's, and /proc files (sysctls such as kernel.core_pattern,
    # sysrq-trigger) check only the uid, so a host running as root would otherwise let model code write them.
    read_only = ["/proc", "/dev", "/"]
    site_packages = os.path.join(os.path.dirname(os.__file__), "site-packages")
    if os.path.isdir(site_packages):
        argv += ["--tmpfs", site_packages]  # hide the base install's third-party packages
        read_only.insert(0, site_packages)
    inside_packages = []
    for name, folder in program.all_packages.items():
        argv += ["--ro-bind", str(folder), f"{INSIDE_LIB}/{name}"]
        inside_packages.append(f"{INSIDE_LIB}/{name}")
    argv += ["--ro-bind", str(host_dir / "inbox"), INSIDE_INBOX,
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.tmp_size_mb * 2**20), "--tmpfs", "/tmp"]
    for path in program.read_only:  # after the tmpfs /tmp, which would hide a path under /tmp
        argv += ["--ro-bind", path, path]
    # Every tmpfs but /tmp read-only (/dev/shm included): memory in them would count against no limit.
    for path in read_only:
        argv += ["--remount-ro", path]
    argv += ["--chdir", "/tmp", "--"]
    spawn = spawn_settings(limits, None)
    return LaunchPlan(argv=argv + python_args(program, python_executable(), [INSIDE_LIB], spawn), cwd=str(host_dir),
                      env=clean_env("/tmp"), inside_tmp="/tmp", inside_inbox=INSIDE_INBOX,
                      inside_read_roots=(*inside_packages, *program.read_only, INSIDE_INBOX))
