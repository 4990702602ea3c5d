"""Calls into the kernel the worker makes for itself while still trusted (through ctypes)."""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2


def die_with_parent(expected_parent_pid: int | None) -> None:
    """Ask for SIGKILL when the parent dies; exit now if it already has."""
    try:
        _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (ImportError, OSError, AttributeError):
        pass
    if expected_parent_pid is not None and os.getppid() != expected_parent_pid:
        os._exit(1)


def install_seccomp(program: bytes) -> str | None:
    """Install a compiled seccomp filter on this (single-threaded) process; returns a problem or None."""
    try:
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        libc = _libc()
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"PR_SET_NO_NEW_PRIVS failed: {os.strerror(ctypes.get_errno())}"
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            return f"PR_SET_SECCOMP failed: {os.strerror(ctypes.get_errno())}"
        return None
    except (ImportError, OSError, AttributeError) as exc:
        return f"seccomp unavailable: {exc}"


def forget_ctypes() -> None:
    """Drop ctypes from the module cache so that model code importing it meets the audit policy."""
    for name in [name for name in sys.modules if name == "ctypes" or name.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)
