"""A seccomp filter (classic BPF, built here: no libseccomp needed) that bubblewrap installs.

It is what keeps "no processes" true at the kernel level even if model code defeats the
in-process policy (e.g. through ``gc``): ``fork``/``vfork`` and ``clone`` without ``CLONE_THREAD``
fail with EPERM (threads still work), ``clone3`` reports ENOSYS so libc falls back to ``clone``.
It also closes kernel interfaces sandboxed code never needs (ptrace, bpf, io_uring, keyrings,
perf events, userfaultfd). RLIMIT_NPROC cannot do the first job when the parent runs as root: the
kernel exempts processes whose real user is root, and bubblewrap maps the sandbox user to it.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQ, _JUMP_GE, _JUMP_SET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_JEQ/BPF_JGE/BPF_JSET | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_CLONE_THREAD = 0x00010000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (little endian: low word of args[0])
_X32_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    audit_arch: int
    clone: int
    clone3: int
    process_calls: tuple[int, ...]  # fork, vfork where they exist
    kernel_surfaces: tuple[int, ...]  # ptrace, keyrings, perf_event_open, bpf, userfaultfd, io_uring
    has_x32: bool


_ARCHES = {
    "x86_64": _Arch(0xC000003E, clone=56, clone3=435, process_calls=(57, 58),
                    kernel_surfaces=(101, 248, 249, 250, 298, 321, 323, 425, 426, 427), has_x32=True),
    "aarch64": _Arch(0xC00000B7, clone=220, clone3=435, process_calls=(),
                     kernel_surfaces=(117, 217, 218, 219, 241, 280, 282, 425, 426, 427), has_x32=False),
}


def build_filter(allow_subprocesses: bool, machine: str | None = None) -> bytes | None:
    """The compiled filter for this machine, or None where the architecture is not supported."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    program: list[tuple[int, object, object, int]] = [(_LOAD_WORD, 0, 0, _ARCH),
                                                      (_JUMP_EQ, 0, "kill", arch.audit_arch),
                                                      (_LOAD_WORD, 0, 0, _NR)]
    if arch.has_x32:
        program.append((_JUMP_GE, "eperm", 0, _X32_BIT))
    denied = arch.kernel_surfaces + (() if allow_subprocesses else arch.process_calls)
    program += [(_JUMP_EQ, "eperm", 0, number) for number in denied]
    if not allow_subprocesses:
        program += [(_JUMP_EQ, "enosys", 0, arch.clone3),
                    (_JUMP_EQ, 0, "allow", arch.clone),
                    (_LOAD_WORD, 0, 0, _ARG0),
                    (_JUMP_SET, "allow", "eperm", _CLONE_THREAD)]
    labels = {"allow": (_RETURN, 0, 0, _ALLOW), "eperm": (_RETURN, 0, 0, _ERRNO | errno.EPERM),
              "enosys": (_RETURN, 0, 0, _ERRNO | errno.ENOSYS), "kill": (_RETURN, 0, 0, _KILL_PROCESS)}
    position = {name: len(program) + index for index, name in enumerate(labels)}
    program += labels.values()
    return b"".join(struct.pack("<HBBI", code, _offset(jt, position, index), _offset(jf, position, index), k)
                    for index, (code, jt, jf, k) in enumerate(program))


def _offset(target: object, position: dict[str, int], index: int) -> int:
    """Jump targets are relative to the next instruction."""
    return target if isinstance(target, int) else position[target] - index - 1
