"""Starting a worker for use, written once for every kind of sandbox.

Take a started process from a pool, wait for its ``ready``, build the seccomp filter for the pid it
sees itself as, send ``init`` with the limits (and what the kind of sandbox adds), expect
``init_done``, and log the protections it runs without. A worker that fails on the way is reaped,
its exit and stderr named in the error; one failure is retried, since a pre-started worker may have
died while it waited in the pool.

:func:`start_worker` drives the worker from an event loop (:meth:`Worker.attach`);
:func:`start_worker_blocking` from one thread (:meth:`Worker.open_channel`), for callers whose
requests are blocking calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import framing
from .channel import BlockingChannel
from .errors import ProtocolViolation, SandboxError, WorkerGone
from .gaps import report_missing_protections
from .limits import Limits
from .pool import WorkerPool
from .seccomp import build_filter
from .worker import Worker

_MAX_ERROR_CHARS = 10_000
_FAILURES = (WorkerGone, ProtocolViolation, OSError)


@dataclass(frozen=True)
class WorkerSetup:
    """What a kind of sandbox sends its workers at start-up.

    ``kind`` names the sandbox in errors and warnings. ``pin_signals`` limits the worker's signals
    to itself (a command agent must signal its own children: False). ``prepare`` readies a worker's
    files (its inbox, its folders' modes) and returns the rest of its ``init`` message. ``failed``
    prefixes the error the worker reports when its own set-up fails.
    """

    kind: str
    limits: Limits
    allow_subprocesses: bool = False
    pin_signals: bool = True
    prepare: Callable[[Worker], dict[str, Any]] = field(default=lambda worker: {})
    failed: str = ""
    timeout_s: float = 30.0

    def init_message(self, worker: Worker, own_pid: int) -> tuple[dict[str, Any], bytes | None]:
        """The ``init`` message and the seccomp filter in it (None where the architecture has none)."""
        program = build_filter(self.allow_subprocesses, own_pid=own_pid if self.pin_signals else None)
        return {"op": "init", "limits": self.limits.rlimits(),
                "seccomp_filter": None if program is None else program.hex(), **self.prepare(worker)}, program

    def check_init_done(self, worker: Worker, reply: dict[str, Any], program: bytes | None) -> None:
        framing.expect(reply, "init_done")
        error = framing.text_field(reply, "error", _MAX_ERROR_CHARS)
        if error is not None:
            raise SandboxError(f"{self.failed or f'the {self.kind} sandbox worker ({worker.backend}) failed to start: '}"
                               f"{error}")
        report_missing_protections(self.kind, worker, reply, program)

    def start_failed(self, worker: Worker, problem: str) -> SandboxError:
        return SandboxError(f"the {self.kind} sandbox worker ({worker.backend}) {problem}; "
                            f"its stderr: {worker.stderr_tail() or '(empty)'}")


async def start_worker(pool: WorkerPool, setup: WorkerSetup) -> Worker:
    """A worker of ``pool`` attached to the running loop and initialised; SandboxError when two tries fail."""
    for _ in range(2):
        try:
            worker = await pool.acquire()
        except OSError as exc:
            raise SandboxError(f"could not start a {setup.kind} sandbox worker ({pool.backend}): {exc}") from exc
        try:
            await asyncio.wait_for(_handshake(worker, setup), setup.timeout_s)
            return worker
        except asyncio.TimeoutError:
            await _reap(worker)
            problem = f"did not start within {setup.timeout_s:g} s"
        except _FAILURES as exc:
            problem = f"{worker.describe_exit(await _reap(worker, grace_s=1.0))} while starting ({exc})"
        except BaseException:
            await _reap(worker)
            worker.discard()
            raise
        finally:
            pool.refill()  # after the set-up: a replacement started earlier would compete with it for the CPU
        error = setup.start_failed(worker, problem)
        worker.discard()
    raise error


def start_worker_blocking(pool: WorkerPool, setup: WorkerSetup,
                          spare_deadline: float | None = None) -> tuple[Worker, BlockingChannel]:
    """A worker of ``pool`` and its channel, initialised from this thread; SandboxError when two tries fail.

    A pre-started worker gets only until ``spare_deadline`` (a ``monotonic`` time) to answer, when
    given: a frozen one must not hold a request longer (TimeoutError); a worker started for the
    call gets ``setup.timeout_s``.
    """
    for _ in range(2):
        spare = pool.take_idle()
        try:
            worker = spare or pool.acquire_blocking()
        except OSError as exc:
            raise SandboxError(f"could not start a {setup.kind} sandbox worker ({pool.backend}): {exc}") from exc
        limited = spare is not None and spare_deadline is not None
        try:
            channel = worker.open_channel()
            _handshake_blocking(worker, channel, setup,
                                spare_deadline if limited else time.monotonic() + setup.timeout_s)
            return worker, channel
        except TimeoutError:
            if limited:
                worker.discard()
                raise
            worker.reap()
            problem = f"did not start within {setup.timeout_s:g} s"
        except _FAILURES as exc:
            problem = f"{worker.describe_exit(worker.reap(grace_s=1.0))} while starting ({exc})"
        except BaseException:
            worker.discard()
            raise
        finally:
            pool.refill()
        error = setup.start_failed(worker, problem)
        worker.discard()
    raise error


async def _handshake(worker: Worker, setup: WorkerSetup) -> None:
    message, program = setup.init_message(worker, await worker.attach())
    worker.send(message)
    setup.check_init_done(worker, await worker.receive(), program)


def _handshake_blocking(worker: Worker, channel: BlockingChannel, setup: WorkerSetup, deadline: float) -> None:
    ready = channel.receive(deadline)
    framing.expect(ready, "ready")
    message, program = setup.init_message(worker, framing.int_field(ready, "pid"))
    channel.send(message, deadline)
    setup.check_init_done(worker, channel.receive(deadline), program)


async def _reap(worker: Worker, grace_s: float = 0.0) -> int | None:
    """The exit status of a worker stopped now (after ``grace_s`` to end by itself); None if it would not be reaped."""
    try:
        return await asyncio.wait_for(worker.wait(grace_s, keep_files=True), 10)
    except asyncio.TimeoutError:
        return None
