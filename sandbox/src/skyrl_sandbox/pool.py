"""Pre-started workers, so creating a sandbox does not wait for an interpreter (or a container) to boot.

All workers are started from one long-lived thread: the kernel's parent-death signal (used by
``bwrap --die-with-parent`` and by the plain worker) fires when the *thread* that started a process
exits, so starting them from short-lived executor threads would kill them early.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .choice import resolve_backend
from .launch import WorkerProgram
from .limits import Limits
from .registry import get_backend
from .worker import Worker

SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skyrl-sandbox-spawner")
_SHARED: dict[tuple, WorkerPool] = {}
_SHARED_LOCK = threading.Lock()


class WorkerPool:
    """Keeps ``size`` idle workers of one program started; hands them out and starts replacements.

    ``backend`` is a backend name or 'auto' (see :func:`skyrl_sandbox.resolve_backend`); ``usable``
    limits what 'auto' may pick to the backends that can run the program (default: all); ``image`` is the
    container image of backends that run images (default: their base image).
    """

    def __init__(self, program: WorkerProgram, limits: Limits, backend: str = "auto", size: int = 2,
                 usable: Sequence[str] | None = None, image: str | None = None) -> None:
        self.backend = resolve_backend(backend, usable)
        self.program = program
        self.limits = limits
        self.size = size
        self.image = image
        self._idle: deque[Worker] = deque()
        self._starting = 0
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    @classmethod
    def shared(cls, program: WorkerProgram, limits: Limits, backend: str = "auto", size: int = 2,
               usable: Sequence[str] | None = None, image: str | None = None) -> WorkerPool:
        """The process-wide pool for workers started this way (keyed by pid: a fork gets its own)."""
        key = (os.getpid(), program.key, limits.spawn_key, resolve_backend(backend, usable), size, image)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = cls(program, limits, backend, size, usable, image)
            return _SHARED[key]

    @property
    def idle_count(self) -> int:
        """Started workers waiting to be handed out."""
        with self._lock:
            return len(self._idle)

    def take_idle(self) -> Worker | None:
        """An idle started worker, or None when none is idle (never waits)."""
        with self._lock:
            return self._idle.popleft() if self._idle else None

    async def acquire(self) -> Worker:
        """An idle started worker, or a newly started one when none is idle.

        Call :meth:`refill` once the worker is set up: replacements started earlier would compete
        with it for the CPU.
        """
        worker = self.take_idle()
        if worker is None:
            worker = await asyncio.wrap_future(SPAWNER.submit(self.start_worker))
        return worker

    def acquire_blocking(self) -> Worker:
        """:meth:`acquire` for callers without an event loop: blocks the calling thread while a worker starts."""
        worker = self.take_idle()
        return worker if worker is not None else SPAWNER.submit(self.start_worker).result()

    def start_worker(self) -> Worker:
        """Start one worker on this pool's backend (blocking)."""
        return get_backend(self.backend).start_worker(self.program, self.limits, self.image)

    def refill(self) -> None:
        with self._lock:
            missing = 0 if self._closed else self.size - len(self._idle) - self._starting
            self._starting += max(missing, 0)
        for _ in range(missing):
            SPAWNER.submit(self._start_idle)

    def _start_idle(self) -> None:
        try:
            worker = self.start_worker()
        except Exception:  # noqa: BLE001 - acquire() starts its own and reports the error there
            with self._lock:
                self._starting -= 1
            return
        with self._lock:
            self._starting -= 1
            if not self._closed:
                self._idle.append(worker)
                return
        worker.discard()

    def close(self) -> None:
        """Kill the idle workers and stop refilling (workers handed out are unaffected)."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        for worker in idle:
            worker.discard()
