"""Pre-started workers, so creating a sandbox does not wait for an interpreter to boot.

All workers are started from one long-lived thread: the kernel's parent-death signal (used by
``bwrap --die-with-parent`` and by the plain worker) fires when the *thread* that started a process
exits, so starting them from short-lived executor threads would kill them early.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from .cgroups import WorkerCgroup, cgroup_support
from .config import SandboxConfig
from .launch import make_host_dir, plan_bwrap, plan_subprocess, resolve_backend
from .process import WorkerProcess

# bwrap's own processes in the worker's pids group: the outer bwrap and the namespace's init.
_BWRAP_TASKS = 2

_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skyrl-sandbox-spawner")
_SHARED: dict[tuple, SandboxPool] = {}
_SHARED_LOCK = threading.Lock()


class SandboxPool:
    """Keeps ``size`` idle workers started; hands them out and starts replacements in the background."""

    def __init__(self, config: SandboxConfig, size: int | None = None) -> None:
        self.backend = resolve_backend(config.backend)
        self.size = config.pool_size if size is None else size
        self._max_message_bytes = config.max_message_mb * 1024 * 1024
        self._tmp_size_mb = config.tmp_size_mb
        self._pids_max = config.max_processes + (_BWRAP_TASKS if self.backend == "bwrap" else 0)
        # RLIMIT_AS bounds the interpreter; the private /tmp is a tmpfs whose pages count here too.
        self._memory_bytes = (config.memory_mb + config.tmp_size_mb) * 2**20
        self._idle: deque[WorkerProcess] = deque()
        self._starting = 0
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    @classmethod
    def shared(cls, config: SandboxConfig) -> SandboxPool:
        """The process-wide pool for workers started the way ``config`` asks.

        Keyed by pid too: a forked child must not hand out its parent's workers.
        """
        key = (os.getpid(), resolve_backend(config.backend), config.tmp_size_mb, config.max_message_mb,
               config.pool_size, config.max_processes, config.memory_mb)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = cls(config)
            return _SHARED[key]

    @property
    def idle_count(self) -> int:
        """Started workers waiting to be handed out."""
        with self._lock:
            return len(self._idle)

    async def acquire(self) -> WorkerProcess:
        """An idle started worker, or a newly started one when none is idle.

        Call :meth:`refill` once the worker is set up: replacements started earlier would compete
        with it for the CPU.
        """
        with self._lock:
            worker = self._idle.popleft() if self._idle else None
        if worker is None:
            worker = await asyncio.wrap_future(_SPAWNER.submit(self.start_worker))
        return worker

    def start_worker(self) -> WorkerProcess:
        host_dir = make_host_dir()
        if self.backend == "bwrap":
            plan = plan_bwrap(host_dir, self._max_message_bytes, self._tmp_size_mb)
        else:
            plan = plan_subprocess(host_dir, self._max_message_bytes)
        support = cgroup_support()
        cgroup = None if support is None else WorkerCgroup(support, self._pids_max, self._memory_bytes)
        return WorkerProcess(self.backend, plan, host_dir, self._max_message_bytes, cgroup)

    def refill(self) -> None:
        with self._lock:
            missing = 0 if self._closed else self.size - len(self._idle) - self._starting
            self._starting += max(missing, 0)
        for _ in range(missing):
            _SPAWNER.submit(self._start_idle)

    def _start_idle(self) -> None:
        try:
            worker = self.start_worker()
        finally:
            with self._lock:
                self._starting -= 1
        with self._lock:
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
