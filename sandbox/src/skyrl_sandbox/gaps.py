"""Say, once per process and kind of sandbox, which protection a started worker runs without."""

from __future__ import annotations

import logging
import platform
from typing import Any

from .registry import get_backend
from .worker import Worker

log = logging.getLogger(__name__)
_reported: set[str] = set()


def missing_protections(worker: Worker, init_done: dict[str, Any], seccomp_program: bytes | None) -> list[str]:
    """What the worker reported it could not install, plus what the host could not give it."""
    gaps = [str(item)[:500] for item in init_done.get("warnings") or []]
    if seccomp_program is None:
        gaps.append(f"no seccomp filter for this architecture ({platform.machine()}): process creation, signals and "
                    "kernel interfaces are limited only by the backend")
    if worker.cgroup is None and not get_backend(worker.backend).owns_limits:
        gaps.append("no writable cgroup: threads are bounded by RLIMIT_NPROC (not for root) and memory by "
                    "RLIMIT_AS plus the tmpfs size")
    return gaps


def report_missing_protections(kind: str, worker: Worker, init_done: dict[str, Any],
                               seccomp_program: bytes | None) -> None:
    """Log a warning naming every missing protection, the first time a ``kind`` of sandbox lacks one."""
    gaps = missing_protections(worker, init_done, seccomp_program)
    if gaps and kind not in _reported:
        _reported.add(kind)
        log.warning("%s sandbox (%s) runs without some protection: %s", kind, worker.backend, "; ".join(gaps))
