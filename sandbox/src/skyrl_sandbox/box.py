"""A sandbox with a work directory: one-shot commands, and files copied in and out.

A :class:`Box` is a command agent (``skyrl_sandbox_runtime.agent``) in a worker whose private,
size-limited /tmp is the work directory: a bwrap or subprocess worker, or the main process of a
container (whose image needs python3, as the base image has). Each :meth:`Box.run` starts the
command there; everything a box returns is capped.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time

from . import framing
from .dirs import process_dir
from .errors import ProtocolViolation, SandboxError, WorkerGone
from .launch import RUNTIME_NAME, WorkerProgram
from .limits import Limits
from .pool import WorkerPool
from .run_result import RunResult
from .startup import WorkerSetup, start_worker
from .worker import Worker

AGENT_PROGRAM = WorkerProgram(module=f"{RUNTIME_NAME}.agent", packages={})
_START_TIMEOUT_S = 30.0
_REPLY_GRACE_S = 5.0  # the agent enforces the command's time limit; this is the backstop


class Box:
    """An isolated work directory; create with ``await Box.create(...)`` and close when done."""

    backend: str

    def __init__(self, worker: Worker, backend: str, limits: Limits) -> None:
        self._worker = worker
        self.backend = backend
        self.limits = limits
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._closed = False

    @classmethod
    async def create(cls, backend: str = "auto", limits: Limits | None = None, *, image: str | None = None,
                     env: dict[str, str] | None = None, pool_size: int = 0) -> Box:
        """Start a box on ``backend`` (see :func:`skyrl_sandbox.resolve_backend`); ``env`` is added to
        every command's environment (never the parent's)."""
        limits = limits or Limits()
        pool = await asyncio.to_thread(WorkerPool.shared, AGENT_PROGRAM, limits, backend, pool_size, None, image)

        def prepare(worker: Worker) -> dict:
            if worker.plan.on_host_paths and os.geteuid() == 0:
                # The agent becomes nobody: it must still reach its work directory.
                for folder in (process_dir(), worker.host_dir):
                    os.chmod(folder, 0o711)
            return {"work_dir": worker.plan.inside_tmp, "env": env or {}}

        setup = WorkerSetup("command", limits, allow_subprocesses=True, pin_signals=False, prepare=prepare,
                            failed="the command agent failed to start: ", timeout_s=_START_TIMEOUT_S)
        return cls(await start_worker(pool, setup), pool.backend, limits)

    async def __aenter__(self) -> Box:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = ".",
                  max_output_bytes: int = 64 * 1024) -> RunResult:
        """Run ``argv`` in the work directory; a time-out or a limit comes back in the result, never raised."""
        if not argv or not all(isinstance(arg, str) for arg in argv):
            raise SandboxError(f"argv must be a non-empty list of strings, got {argv!r}")
        started = time.monotonic()
        reply = await self._request({"op": "run", "argv": argv, "stdin": base64.b64encode(stdin).decode(),
                                     "timeout_s": timeout_s, "cwd": cwd, "max_output_bytes": max_output_bytes},
                                    timeout_s + _REPLY_GRACE_S)
        exit_code = reply.get("exit_code")
        if not isinstance(exit_code, int) or isinstance(exit_code, bool):
            raise ProtocolViolation("field 'exit_code' must be an integer")
        return RunResult(
            exit_code=exit_code,
            stdout=_decode(reply, "stdout", max_output_bytes), stderr=_decode(reply, "stderr", max_output_bytes),
            stdout_truncated=bool(reply.get("stdout_truncated")), stderr_truncated=bool(reply.get("stderr_truncated")),
            timed_out=bool(reply.get("timed_out")), duration_s=time.monotonic() - started)

    async def ping(self) -> None:
        """One round trip to the agent (a health check; what the benchmark times)."""
        await self._request({"op": "ping"}, _START_TIMEOUT_S)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Copy ``data`` into the work directory at ``path`` (relative to it)."""
        if len(data) * 4 // 3 + 1024 > self.limits.max_message_bytes:
            raise SandboxError(f"{len(data):,} bytes exceed what one message carries "
                               f"(max_message_mb={self.limits.max_message_mb})")
        await self._request({"op": "write", "path": path, "data": base64.b64encode(data).decode(), "mode": mode},
                            _START_TIMEOUT_S)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        """Copy a file out of the work directory; raises SandboxError past ``max_bytes``."""
        reply = await self._request({"op": "read", "path": path, "max_bytes": max_bytes}, _START_TIMEOUT_S)
        if reply.get("truncated"):
            raise SandboxError(f"{path!r} is larger than max_bytes={max_bytes:,}")
        return _decode(reply, "data", max_bytes)

    async def close(self) -> None:
        """Kill the box and everything in it, and remove its files. Idempotent."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.wait()

    async def _request(self, message: dict, timeout_s: float) -> dict:
        if self._closed or self._worker is None:
            raise SandboxError("the box is closed")
        async with self._lock:
            self._next_id += 1
            worker = self._worker
            try:
                worker.send({**message, "id": self._next_id})
                reply = await asyncio.wait_for(worker.receive(), timeout_s)
                framing.expect(reply, "reply")
                if reply.get("id") != self._next_id:
                    raise ProtocolViolation("a reply to another request")
            except (asyncio.TimeoutError, WorkerGone, ProtocolViolation) as exc:
                await self.close()
                raise SandboxError(f"the {self.backend} box broke down and was closed: "
                                   f"{type(exc).__name__}: {exc or 'no reply in time'}") from exc
        error = reply.get("error")
        if error is not None:
            raise SandboxError(framing.text_field(reply, "error", 4000))
        return reply


def _decode(reply: dict, key: str, max_bytes: int) -> bytes:
    text = framing.text_field(reply, key, (max_bytes + 2) * 4 // 3 + 4, optional=False)
    try:
        return base64.b64decode(text, validate=True)[:max_bytes]
    except ValueError as exc:
        raise ProtocolViolation(f"field {key!r} is not base64") from exc


async def run(argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, *, backend: str = "auto",
              limits: Limits | None = None, image: str | None = None) -> RunResult:
    """Run one command in a fresh box that is closed afterwards."""
    async with await Box.create(backend, limits, image=image) as box:
        return await box.run(argv, stdin, timeout_s)
