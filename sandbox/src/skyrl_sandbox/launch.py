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
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .limits import Limits

RUNTIME_PACKAGE = Path(__file__).resolve().parent / "runtime"
RUNTIME_NAME = "skyrl_sandbox_runtime"
INSIDE_LIB = "/skyrl/lib"
INSIDE_INBOX = "/skyrl/inbox"
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
    signals_as_status: bool = False  # a wrapper (bwrap) reports the worker's death by signal N as status 128 + N
    on_host_paths: bool = False  # the worker sees the host's own folders (no mount namespace)


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
