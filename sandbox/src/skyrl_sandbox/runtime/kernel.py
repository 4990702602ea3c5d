"""Calls into the kernel a worker makes for itself while still trusted (rlimits, and ctypes for the rest)."""

from __future__ import annotations

import os
import resource
import signal
import sys

_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 1, 38, 22, 2
_PR_CAPBSET_DROP, _CAPABILITY_VERSION_3, _LAST_CAPABILITY = 24, 0x20080522, 63


_LIMITS = {
    "cpu_time_s": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "max_processes": resource.RLIMIT_NPROC,
    "max_open_files": resource.RLIMIT_NOFILE,
    "max_file_size_bytes": resource.RLIMIT_FSIZE,
}


def apply_limits(limits: dict[str, int]) -> None:
    """Set the rlimits the parent sent (``Limits.rlimits()``), never above a hard limit already in force."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in _LIMITS.items():
        soft = limits[key]
        # A second of grace before SIGKILL: the soft CPU limit only sends SIGXCPU, which code can ignore.
        hard = soft + 1 if which == resource.RLIMIT_CPU else soft
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))


def lock_down(init: dict) -> list[str]:
    """The last trusted steps of every worker, in order: the parent's rlimits, no capabilities, the
    seccomp filter (hex in ``init["seccomp_filter"]``). Returns the protections that could not be had."""
    apply_limits(init["limits"])
    program = init.get("seccomp_filter")
    problems = [drop_capabilities(), install_seccomp(bytes.fromhex(program)) if program else None]
    return [problem for problem in problems if problem]


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


def drop_capabilities() -> str | None:
    """Empty every capability set of this process (a root parent's worker would keep them all).

    Returns a problem or None. A no-op for a process that holds none (the bwrap backend).
    """
    try:
        with open("/proc/self/status") as status:
            held = {key: value.strip() for key, value in (line.split(":", 1) for line in status if ":" in line)}
    except OSError as exc:
        return f"capabilities unknown: {exc}"
    if int(held.get("CapEff", "0"), 16) == 0 and int(held.get("CapBnd", "0"), 16) == 0:
        return None
    try:
        import ctypes

        libc = _libc()
        for capability in range(_LAST_CAPABILITY + 1):
            libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last: ignored
        header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
        if libc.capset(header, data) != 0:
            return f"capset failed: {os.strerror(ctypes.get_errno())}"
        return None
    except (ImportError, OSError, AttributeError) as exc:
        return f"capabilities not dropped: {exc}"


def forget_ctypes() -> None:
    """Drop ctypes from the module cache so that model code importing it meets the audit policy."""
    for name in [name for name in sys.modules if name == "ctypes" or name.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)
