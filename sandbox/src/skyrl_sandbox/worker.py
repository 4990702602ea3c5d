"""What every started worker offers, whatever the backend (a process, or a container)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from .cgroups import WorkerCgroup
from .channel import BlockingChannel
from .launch import LaunchPlan


class Worker(Protocol):
    """A started worker program: :class:`~skyrl_sandbox.process.WorkerProcess` (bwrap, subprocess) or
    :class:`~skyrl_sandbox.backends.docker.worker.ContainerWorker`. Drive it from one event loop."""

    backend: str
    plan: LaunchPlan  # the paths as the worker sees them
    host_dir: Path  # its private host folder (the inbox)
    cgroup: WorkerCgroup | None

    @property
    def pid(self) -> int: ...

    def open_channel(self) -> BlockingChannel:
        """The channel for one thread without an event loop (instead of :meth:`attach`); ``ready`` comes first."""

    def running(self) -> bool:
        """Whether the worker still runs (not exited, not dying)."""

    def reap(self, grace_s: float = 0.0) -> int:
        """Blocking :meth:`wait` that keeps the files for :meth:`discard`: the exit status."""

    async def attach(self) -> int:
        """Bind the channel to the running loop and wait for ``ready``; the worker's own pid."""

    def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any]:
        """The next frame, checked (size, structure, shape); raises ProtocolViolation or WorkerGone."""

    async def has_unread_data(self) -> bool: ...

    def task_count(self) -> int:
        """Threads and processes inside, counted from outside."""

    def write_inbox(self, name: str, data: bytes) -> str:
        """Put a file where the worker reads it; its path inside."""

    def kill(self) -> None: ...

    def discard(self) -> None: ...

    async def wait(self, grace_s: float = 0.0, keep_files: bool = False) -> int: ...

    def stderr_tail(self, limit: int = 2000) -> str: ...

    def describe_exit(self, status: int | None) -> str: ...
