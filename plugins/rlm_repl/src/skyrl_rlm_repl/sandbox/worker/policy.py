"""An audit hook that refuses, with a clear PermissionError, what model code must not do.

This is the second line of defence: the OS-level isolation (bubblewrap namespaces, rlimits) is the
boundary. The hook makes refusals readable ("network access is disabled in the sandbox") instead
of obscure errno failures, and it is what keeps files and the network away with the plain
``subprocess`` backend. Audit hooks cannot be removed once added; ctypes, the one pure-Python way
around them, is refused too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

_PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
_READ_PATH_EVENTS = frozenset({"os.listdir", "os.scandir", "os.chdir", "glob.glob", "os.chroot"})
_WRITE_PATH_EVENTS = frozenset({
    "os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.lchown", "os.mkdir", "os.remove", "os.rmdir",
    "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.chown",
})
_TWO_PATH_WRITE_EVENTS = frozenset({"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree",
                                    "shutil.move"})
_KILL_EVENTS = frozenset({"os.kill", "os.killpg"})
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_testcapi", "_testinternalcapi", "_xxsubinterpreters"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_READABLE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})


class SandboxPolicy:
    """Decides every audited operation; ``install`` makes it permanent for the process."""

    def __init__(self, read_roots: Iterable[str], write_roots: Iterable[str], denied_roots: Iterable[str],
                 allow_subprocesses: bool) -> None:
        self.write_roots = tuple(os.path.realpath(root) for root in write_roots)
        self.read_roots = tuple(os.path.realpath(root) for root in read_roots) + self.write_roots
        self.denied_roots = tuple(os.path.realpath(root) for root in denied_roots)
        self.allow_subprocesses = allow_subprocesses
        self._own_pid = os.getpid()
        self._realpath = os.path.realpath
        self._fsdecode = os.fsdecode
        self._isdir = os.path.isdir

    def install(self) -> None:
        sys.addaudithook(self.check)

    def check(self, event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            self._check_path(path, writing)
            self._check_directory_fd(path)
        elif event in _READ_PATH_EVENTS:
            self._check_path(args[0] if args else ".", writing=False)
        elif event in _WRITE_PATH_EVENTS:
            self._check_path(args[0], writing=True)
        elif event in _TWO_PATH_WRITE_EVENTS:
            self._check_path(args[0], writing=event != "os.symlink")
            self._check_path(args[1], writing=True)
        elif event.startswith("socket."):
            raise PermissionError(f"network access is disabled in the sandbox ({event})")
        elif event == "sqlite3.enable_load_extension":
            raise PermissionError("loading native extensions is disabled in the sandbox")
        elif event == "sqlite3.connect":
            self._check_path(args[0], writing=True)
        elif event in _PROCESS_EVENTS and not self.allow_subprocesses:
            raise PermissionError(f"starting processes is disabled in the sandbox ({event})")
        elif event in _KILL_EVENTS and not (event == "os.kill" and args[0] == self._own_pid):
            raise PermissionError(f"sending signals to other processes is disabled in the sandbox ({event})")
        elif event == "import" and args and args[0] in _BLOCKED_MODULES:
            raise PermissionError(f"module {args[0]!r} is disabled in the sandbox")
        elif event in ("resource.setrlimit", "resource.prlimit"):
            raise PermissionError("changing resource limits is disabled in the sandbox")
        elif event.startswith("ctypes."):
            raise PermissionError(f"ctypes is disabled in the sandbox ({event})")

    def _check_directory_fd(self, path: object) -> None:
        """Refuse directory descriptors outside the write roots: paths relative to one (``dir_fd``)
        would be checked against the working directory instead of it."""
        if isinstance(path, (str, bytes, os.PathLike)):
            real = self._realpath(self._fsdecode(path))
            if self._isdir(real) and not _under(real, self.write_roots):
                raise PermissionError(f"opening the directory {real!r} as a file descriptor is not allowed in the "
                                      "sandbox (only folders inside the private temp folder)")

    def _check_path(self, path: object, writing: bool) -> None:
        if path is None or isinstance(path, int):
            return  # an already open file descriptor
        if isinstance(path, (str, bytes, os.PathLike)):
            name = self._fsdecode(path)
            if name == ":memory:" or name == "":
                return
            if not os.path.isabs(name) and ".." in name.split(os.sep):
                # The audit event does not say which directory a relative path is resolved in
                # (``dir_fd``), so a path that climbs out of it cannot be checked: refuse it.
                raise PermissionError(f"relative paths that go up ('..') are not allowed in the sandbox: {name!r}")
            real = self._realpath(name)
            if not writing and real in _READABLE_DEVICES:
                return
            roots = self.write_roots if writing else self.read_roots
            if _under(real, roots) and not _under(real, self.denied_roots):
                return
            action = "writing" if writing else "reading"
            raise PermissionError(f"{action} {name!r} is outside the sandbox; use the private temp folder "
                                  f"{self.write_roots[0]!r}")
        raise PermissionError(f"unsupported path type {type(path).__name__}")


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)
