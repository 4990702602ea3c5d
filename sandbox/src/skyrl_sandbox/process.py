"""One worker process (bwrap or subprocess): started synchronously by the pool, then driven from an asyncio loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import weakref
from pathlib import Path
from typing import Any

from . import framing
from .cgroups import WorkerCgroup, cgroup_support
from .channel import BlockingChannel
from .dirs import remove_tree
from .errors import WorkerGone
from .launch import LaunchPlan
from .limits import Limits


class WorkerProcess:
    """A started worker, its private host folder, and (once attached to a loop) its channel."""

    def __init__(self, backend: str, plan: LaunchPlan, host_dir: Path, max_message_bytes: int,
                 cgroup: WorkerCgroup | None = None) -> None:
        self.backend = backend
        self.plan = plan
        self.host_dir = host_dir
        self.max_message_bytes = max_message_bytes
        self.cgroup = cgroup
        try:
            with open(host_dir / "stderr.log", "wb") as stderr:
                self.popen = subprocess.Popen(plan.argv, cwd=plan.cwd, env=plan.env, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=stderr, start_new_session=True,
                                              preexec_fn=lambda: enter_child(cgroup))
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        # Runs on close(), on garbage collection and at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _kill_and_remove, self.popen, host_dir, os.getpid(), cgroup)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.WriteTransport | None = None
        self._read_transport: asyncio.ReadTransport | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        """Whether the worker still runs: not exited, and not dying.

        A killed multi-threaded process shows its main thread as a zombie while the other threads
        exit, and cannot be reaped (``poll``) until the last one has; its channel stays open until then.
        """
        return self.popen.poll() is None and not exiting(self.popen.pid)

    def open_channel(self) -> BlockingChannel:
        """The pipes as a channel driven from one thread (instead of :meth:`attach`); ``ready`` is its first frame."""
        return BlockingChannel(self.popen.stdout.fileno(), self.popen.stdin.fileno(), self.max_message_bytes)

    def reap(self, grace_s: float = 0.0) -> int:
        """:meth:`wait` for callers without an event loop; the files stay for :meth:`discard`."""
        try:
            return self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.wait()

    async def attach(self) -> int:
        """Connect the pipes to the running loop, wait for ``ready``; returns the worker's own view of its pid."""
        loop = asyncio.get_running_loop()
        self._reader = asyncio.StreamReader(limit=2**20)
        self._read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self._reader), self.popen.stdout)
        self._writer, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, self.popen.stdin)
        ready = await self.receive()
        framing.expect(ready, "ready")
        return framing.int_field(ready, "pid")

    def send(self, message: dict[str, Any]) -> None:
        if self._writer is None or self._writer.is_closing():
            raise WorkerGone("the worker's channel is closed")
        self._writer.write(framing.encode(message))

    async def receive(self) -> dict[str, Any]:
        assert self._reader is not None, "attach() first"
        return await framing.read_message(self._reader, self.max_message_bytes)

    async def has_unread_data(self) -> bool:
        """Whether the worker sent anything not read yet (in the reader's buffer or still in the pipe)."""
        assert self._reader is not None, "attach() first"
        await asyncio.sleep(0)  # let the read transport move what is in the pipe
        # StreamReader has no public count of buffered bytes.
        return framing.bytes_waiting(self.popen.stdout.fileno()) > 0 or bool(self._reader._buffer)  # type: ignore[attr-defined]

    def task_count(self) -> int:
        """Threads (and processes) the worker runs now, counted from outside: its pids group, else /proc."""
        if self.cgroup is not None:
            count = self.cgroup.task_count()
            if count is not None:
                return count
        return tree_threads(self.popen.pid)

    def write_inbox(self, name: str, data: bytes) -> str:
        """Put a file where the worker can read it; returns its path as the worker sees it."""
        (self.host_dir / "inbox" / name).write_bytes(data)
        return f"{self.plan.inside_inbox}/{name}"

    def kill(self) -> None:
        """SIGKILL the worker's process group (idempotent); reap with :meth:`wait`."""
        for transport in (self._read_transport, self._writer):
            if transport is not None:
                transport.close()
        _kill_group(self.popen)

    def discard(self) -> None:
        """Kill, reap and remove the host folder, blocking (for idle workers never attached)."""
        self._finalizer()

    async def wait(self, grace_s: float = 0.0, keep_files: bool = False) -> int:
        """Give the worker ``grace_s`` to exit by itself, then kill, reap and remove the host folder.

        Returns the exit status; the grace lets a worker that is dying anyway report its own cause.
        ``keep_files`` leaves the folder (and its stderr.log) for :meth:`discard` to remove.
        """
        if grace_s:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.popen.wait), grace_s)
            except asyncio.TimeoutError:
                pass
        self.kill()
        status = await asyncio.to_thread(self.popen.wait)
        if not keep_files:
            self._finalizer()
        return status

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            data = (self.host_dir / "stderr.log").read_bytes()[-limit:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def describe_exit(self, status: int | None) -> str:
        """Why the worker ended, in words (a wrapper may report a signal death as 128 + its number)."""
        if self.cgroup is not None and self.cgroup.oom_killed():
            return "was killed by the kernel at the sandbox memory limit (memory_mb + tmp_size_mb)"
        if status is None:
            return "is no longer responding"
        number = -status if status < 0 else status - 128 if self.plan.signals_as_status and status > 128 else 0
        if number:
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            reason = {"SIGXCPU": " (CPU time limit reached)", "SIGKILL": " (killed)",
                      "SIGSEGV": " (crashed)"}.get(name, "")
            return f"was terminated by {name}{reason}"
        return f"exited with status {status}"



def start_process_worker(backend: str, plan: LaunchPlan, host_dir: Path, limits: Limits,
                         wrapper_tasks: int = 0) -> WorkerProcess:
    """A worker process started by ``plan`` in a cgroup of its own where the host offers one (``wrapper_tasks``:
    the backend's own processes, counted in its process limit)."""
    support = cgroup_support()
    cgroup = None if support is None else WorkerCgroup(support, limits.max_processes + wrapper_tasks,
                                                       limits.pinned_memory_bytes)
    return WorkerProcess(backend, plan, host_dir, limits.max_message_bytes, cgroup)


def default_signals() -> None:
    """In a forked child before it executes: every signal back to its default action, none blocked.

    Only an ignored signal survives ``exec``, and ours would reach the model's commands: a training
    run started with ``&`` from a script ignores SIGINT, and an interactive ``bash`` that inherits an
    ignored SIGINT keeps its own handler and treats ``trap '' INT`` as a no-op (so a command the
    agent shielded from Ctrl-C would still be interrupted, and its commands could never be).
    """
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # the C library's reserved real-time signals
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def enter_child(cgroup: WorkerCgroup | None) -> None:
    """The ``preexec_fn`` of a worker: default signals, then into its cgroup (if any) before it runs anything."""
    default_signals()
    if cgroup is not None:
        cgroup.join()


def _kill_group(popen: subprocess.Popen) -> None:
    if popen.returncode is not None:
        return
    for kill in (lambda: os.killpg(popen.pid, signal.SIGKILL), popen.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def exiting(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, or dying (its main thread exited before the others)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def tree_threads(root: int) -> int:
    """Threads of ``root`` and all its descendants, from /proc (0 for a process that is gone)."""
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            for task in tasks:
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (OSError, ValueError):
            continue
        total += len(tasks)
    return total


def _kill_and_remove(popen: subprocess.Popen, host_dir: Path, owner_pid: int, cgroup: WorkerCgroup | None) -> None:
    if os.getpid() != owner_pid:
        return  # a forked copy of the owner exiting: the workers are not its to kill
    _kill_group(popen)
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if cgroup is not None:
        cgroup.remove()
    for stream in (popen.stdin, popen.stdout):
        if stream is not None and not stream.closed:
            try:
                stream.close()
            except OSError:
                pass
    remove_tree(host_dir)
