"""A seccomp filter (classic BPF, built here: no libseccomp needed) for the worker to install.

The worker installs it on itself before any model code runs (filters can never be removed). It
keeps these true at the kernel level even when model code defeats the in-process audit policy:

- no new processes and no new programs: ``fork``/``vfork``/``execve``/``execveat`` and ``clone``
  without ``CLONE_THREAD`` fail with EPERM (threads still work; ``clone3`` reports ENOSYS so libc
  falls back to ``clone``). RLIMIT_NPROC cannot do this when the parent runs as root: the kernel
  exempts root's processes from it;
- signals only to the worker itself (``kill``/``tkill``/``tgkill``/``rt_sigqueueinfo``/
  ``rt_tgsigqueueinfo`` with another pid fail with EPERM);
- closed kernel interfaces sandboxed code never needs: ptrace, process_vm_readv/writev, pidfd_*,
  bpf, io_uring, keyrings, perf events, userfaultfd, and memfd_create/memfd_secret (anonymous
  files whose pages RLIMIT_AS does not count).
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQ, _JUMP_GE, _JUMP_SET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_JEQ / BPF_JGE / BPF_JSET | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_JUMP_ALWAYS = 0x05  # BPF_JMP | BPF_JA
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_CLONE_THREAD = 0x00010000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (little endian: low word of args[0])
_X32_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    audit_arch: int
    clone: int
    clone3: int
    process_calls: tuple[int, ...]  # fork, vfork where they exist, execve, execveat
    signal_calls: tuple[int, ...]  # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo: arg 0 is the target
    denied: tuple[int, ...]  # ptrace, keyrings, perf_event_open, bpf, userfaultfd, io_uring, process_vm, pidfd,
    # memfd_create and memfd_secret (memory no limit of the sandbox counts)
    has_x32: bool


_ARCHES = {
    "x86_64": _Arch(0xC000003E, clone=56, clone3=435, process_calls=(57, 58, 59, 322),
                    signal_calls=(62, 200, 234, 129, 297),
                    denied=(101, 248, 249, 250, 298, 310, 311, 319, 321, 323, 424, 425, 426, 427, 434, 438, 447),
                    has_x32=True),
    "aarch64": _Arch(0xC00000B7, clone=220, clone3=435, process_calls=(221, 281),
                     signal_calls=(129, 130, 131, 138, 240),
                     denied=(117, 217, 218, 219, 241, 270, 271, 279, 280, 282, 424, 425, 426, 427, 434, 438, 447),
                     has_x32=False),
}


def build_filter(allow_subprocesses: bool, own_pid: int | None = None, machine: str | None = None) -> bytes | None:
    """The compiled filter (``sock_filter`` array) for this machine; None where it is not supported.

    ``own_pid`` (the worker's pid as it sees itself) limits signals to the worker; None leaves them.
    """
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    code: list[tuple[str | None, tuple]] = [
        (None, (_LOAD_WORD, 0, 0, _ARCH)),
        (None, (_JUMP_EQ, 0, "kill", arch.audit_arch)),
        (None, (_LOAD_WORD, 0, 0, _NR)),
    ]
    if arch.has_x32:
        code.append((None, (_JUMP_GE, "eperm", 0, _X32_BIT)))
    denied = arch.denied + (() if allow_subprocesses else arch.process_calls)
    code += [(None, (_JUMP_EQ, "eperm", 0, number)) for number in denied]
    if own_pid is not None:
        code += [(None, (_JUMP_EQ, "signal", 0, number)) for number in arch.signal_calls]
    if not allow_subprocesses:
        code += [(None, (_JUMP_EQ, "enosys", 0, arch.clone3)),
                 (None, (_JUMP_EQ, "clone", 0, arch.clone))]
    code += [(None, (_JUMP_ALWAYS, 0, 0, "allow")),  # BPF jumps only forwards: checks first, returns last
             ("clone", (_LOAD_WORD, 0, 0, _ARG0)),
             (None, (_JUMP_SET, "allow", "eperm", _CLONE_THREAD)),
             ("signal", (_LOAD_WORD, 0, 0, _ARG0)),
             (None, (_JUMP_EQ, "allow", "eperm", own_pid or 0)),
             ("allow", (_RETURN, 0, 0, _ALLOW)),
             ("eperm", (_RETURN, 0, 0, _ERRNO | errno.EPERM)),
             ("enosys", (_RETURN, 0, 0, _ERRNO | errno.ENOSYS)),
             ("kill", (_RETURN, 0, 0, _KILL_PROCESS))]
    where = {label: index for index, (label, _) in enumerate(code) if label}

    def offset(target: int | str, index: int) -> int:  # jumps count from the next instruction
        return target if isinstance(target, int) else where[target] - index - 1

    return b"".join(struct.pack("<HBBI", op, offset(jt, i), offset(jf, i), offset(k, i) if op == _JUMP_ALWAYS else k)
                    for i, (_, (op, jt, jf, k)) in enumerate(code))
