"""The sandboxed persistent REPL: one worker process per episode, driven asynchronously."""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from skyrl_sandbox import ProtocolViolation, SandboxError, WorkerGone, WorkerPool, get_backend, registered
from skyrl_sandbox import framing as protocol
from skyrl_sandbox.cgroups import cgroup_support
from skyrl_sandbox.startup import WorkerSetup, start_worker
from skyrl_sandbox.worker import Worker

from .config import REPL_PROGRAM, SandboxConfig
from .result import ExecResult

RequestHandler = Callable[[str, dict], Awaitable[Any]]
DEFAULT_RPC_METHODS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")
_RESTART_NOTE = ("The sandbox was restarted: every variable from earlier code blocks is lost "
                 "(context and the tools are available again).")
_MAX_ERROR_CHARS = 10_000
FINAL_METHOD = "FINAL"  # the request FINAL/FINAL_VAR send; answered by the sandbox itself, never the handler
_THREAD_EXIT_POLLS, _THREAD_EXIT_POLL_S = 20, 0.01


@dataclass
class _Run:
    """One execution: its sequence number and unguessable token, and what the parent recorded for it."""

    seq: int
    token: str
    final_answer: str | None = None
    subcall_wait_s: float = 0.0


class Sandbox:
    """Runs model code in an isolated worker; the namespace persists across :meth:`execute` calls.

    Create with ``await Sandbox.create(config, context=..., handler=...)``. Calls of the
    ``rpc_methods`` stubs inside the worker arrive at ``handler(method, params)``; for the four
    standard methods ``params`` holds the named arguments (``prompt``/``prompts``, ``context``/
    ``context_list``, ``model``), for others ``{"args": [...], **kwargs}``. The handler's result
    (JSON data) is what the stub returns; if the handler raises, the stub raises RuntimeError.
    """

    backend: str

    def __init__(self, config: SandboxConfig, pool: WorkerPool, context_file: tuple[str, bytes] | None,
                 scaffold_code: str, rpc_methods: Sequence[str], handler: RequestHandler | None) -> None:
        self.config = config
        self.backend = pool.backend
        self._pool = pool
        self._context_file = context_file
        self._scaffold_code = scaffold_code
        self._rpc_methods = tuple(rpc_methods)
        self._handler = handler
        self._worker: Worker | None = None
        self._lock = asyncio.Lock()
        self._seq = 0
        self._closed = False
        self._lost_state = False
        self._baseline_tasks = 0
        self._last_request_id = 0

    @classmethod
    async def create(cls, config: SandboxConfig, *, context: Any = None, scaffold_code: str = "",
                     rpc_methods: Sequence[str] = DEFAULT_RPC_METHODS, handler: RequestHandler | None = None,
                     pool: WorkerPool | None = None) -> Sandbox:
        """Start (or take from the pool) a worker holding ``context``, the scaffold and the stubs."""
        for name in rpc_methods:
            if not isinstance(name, str) or not name.isidentifier():
                raise SandboxError(f"rpc method name {name!r} is not a Python identifier")
        context_file = None if context is None else _encode_context(context)
        if pool is None:
            pool = await asyncio.to_thread(shared_pool, config)
        _check_subprocesses_allowed(config, pool)
        sandbox = cls(config, pool, context_file, scaffold_code, rpc_methods, handler)
        await sandbox._start()
        return sandbox

    @property
    def pid(self) -> int | None:
        """Host PID of the current worker (the bwrap process, or the container's init with docker); None when closed."""
        return None if self._worker is None else self._worker.pid

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def execute(self, code: str, *, timeout_s: float | None = None,
                      deadline: float | None = None) -> ExecResult:
        """Run ``code``; problems caused by the code come back in the result, never as exceptions.

        ``timeout_s`` (default ``exec_timeout_s``) bounds the code's own running time; time spent
        waiting for the sub-call handler is not counted there but is bounded by ``deadline``, an
        absolute ``loop.time()`` by which the whole call must end (a caller's budget for a step of
        several blocks). Either limit stops the worker, which restarts with its variables lost.

        Raises :class:`SandboxError` only for infrastructure failures (closed sandbox, a worker that
        cannot be restarted).
        """
        if self._closed:
            raise SandboxError("execute() on a closed sandbox")
        async with self._lock:
            started = time.monotonic()
            restarted = self._lost_state
            if self._lost_state:
                await self._start()
            result = await self._execute(code, started, self.config.exec_timeout_s if timeout_s is None else timeout_s,
                                         deadline)
            result.sandbox_restarted = result.sandbox_restarted or restarted
            return result

    async def close(self) -> None:
        """Kill the worker and remove its files. Idempotent."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.wait()

    # --- internals ------------------------------------------------------------------------------

    async def _start(self) -> None:
        """Get a worker set up with context, scaffold and stubs."""
        self._lost_state = True
        config = self.config

        def prepare(worker: Worker) -> dict:
            context_path = None if self._context_file is None else worker.write_inbox(*self._context_file)
            return {"context_path": context_path, "scaffold_code": self._scaffold_code,
                    "rpc_methods": list(self._rpc_methods), "tmp_dir": worker.plan.inside_tmp,
                    "read_roots": list(worker.plan.inside_read_roots), "allow_subprocesses": config.allow_subprocesses,
                    "max_output_chars": config.max_output_chars, "echo_last_expression": config.echo_last_expression}

        setup = WorkerSetup("REPL", config.limits(), allow_subprocesses=config.allow_subprocesses, prepare=prepare,
                            failed="the sandbox scaffold failed to load:\n", timeout_s=config.start_timeout_s)
        worker = await start_worker(self._pool, setup)
        self._worker = worker
        self._baseline_tasks = worker.task_count()  # trusted moment: no model code has run yet
        self._last_request_id = 0
        self._lost_state = False

    async def _abandon(self, worker: Worker, grace_s: float = 0.0, keep_files: bool = False) -> int | None:
        if self._worker is worker:
            self._worker = None
        try:
            return await asyncio.wait_for(worker.wait(grace_s, keep_files), 10)
        except asyncio.TimeoutError:
            return None

    async def _execute(self, code: str, started: float, timeout_s: float, deadline: float | None) -> ExecResult:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if len(code.encode("utf-8", "replace")) > self._max_message_bytes:
            return _failure(f"the code block is too large ({len(code):,} characters)", started)
        worker = self._worker
        assert worker is not None
        if await worker.has_unread_data():
            return await self._restart_after(worker, "The sandbox worker sent messages between executions (stray or "
                                             "forged frames) and was stopped.", started)
        self._seq += 1
        run = _Run(seq=self._seq, token=secrets.token_hex(16))
        loop = asyncio.get_running_loop()
        code_deadline = loop.time() + timeout_s
        hard_deadline = math.inf if deadline is None else deadline
        try:
            worker.send({"op": "exec", "seq": run.seq, "token": run.token, "code": code})
            while True:
                wait = min(code_deadline, hard_deadline) - loop.time()
                message = await asyncio.wait_for(worker.receive(), max(wait, 0))
                if protocol.text_field(message, "token", 64) != run.token:
                    raise ProtocolViolation("a message not bound to the running execution")
                if message["op"] == "result":
                    result = self._read_result(message, run, started)
                    return await self._check_threads_ended(worker, result, started)
                protocol.expect(message, "rpc")
                waited_from = loop.time()
                worker.send(await self._answer_request(message, run, hard_deadline))
                run.subcall_wait_s += loop.time() - waited_from
                code_deadline += loop.time() - waited_from  # time waiting for the handler is not the code's
        except asyncio.TimeoutError:
            if loop.time() >= hard_deadline:
                reason = "The time budget of this step ran out (sub-calls included) and the code was stopped."
            else:
                reason = f"Execution exceeded the {timeout_s:g} s time limit and was stopped."
            return await self._restart_after(worker, reason, started, timed_out=True)
        except WorkerGone:
            status = await self._abandon(worker, grace_s=1.0, keep_files=True)
            reason = f"The sandbox worker {worker.describe_exit(status)} while running this code."
            worker.discard()
            return await self._restart_after(worker, reason, started)
        except ProtocolViolation as exc:
            reason = f"The sandbox worker broke the protocol ({exc}) and was stopped."
            return await self._restart_after(worker, reason, started)
        except asyncio.CancelledError:
            worker.kill()
            self._lost_state = True
            raise

    async def _check_threads_ended(self, worker: Worker, result: ExecResult, started: float) -> ExecResult:
        """A thread left running could act in a later execution as if it were that code: none may outlive
        its block (counted from outside the worker, where model code cannot fake it)."""
        for _ in range(_THREAD_EXIT_POLLS):
            extra = worker.task_count() - self._baseline_tasks
            if extra <= 0:
                return result
            await asyncio.sleep(_THREAD_EXIT_POLL_S)
        reason = (f"The code left {extra} thread(s) running after the block ended; threads must finish within their "
                  "block (join them, or use `with ThreadPoolExecutor() as pool:`), so the REPL was stopped.")
        restarted = await self._restart_after(worker, reason, started)
        restarted.stdout, restarted.stderr = result.stdout, result.stderr
        return restarted

    @property
    def _max_message_bytes(self) -> int:
        return self.config.message_mb * 2**20

    def _read_result(self, message: dict, run: _Run, started: float) -> ExecResult:
        if protocol.int_field(message, "seq") != run.seq:
            raise ProtocolViolation("a result for another execution")
        limit = self.config.max_output_chars + 200
        return ExecResult(
            stdout=protocol.text_field(message, "stdout", limit, optional=False),
            stderr=protocol.text_field(message, "stderr", limit, optional=False),
            error=protocol.text_field(message, "error", _MAX_ERROR_CHARS),
            timed_out=False,
            truncated_chars=protocol.int_field(message, "truncated_chars"),
            final_answer=run.final_answer,
            duration_s=time.monotonic() - started,
            sandbox_restarted=False,
            subcall_wait_s=run.subcall_wait_s,
        )

    async def _answer_request(self, message: dict, run: _Run, hard_deadline: float) -> dict:
        request_id = protocol.int_field(message, "id")
        if request_id <= self._last_request_id:
            raise ProtocolViolation(f"request id {request_id} does not follow the last one "
                                            f"({self._last_request_id}): one reply per request")
        self._last_request_id = request_id
        method, params = message.get("method"), message.get("params")
        if not isinstance(method, str) or not isinstance(params, dict):
            raise ProtocolViolation("a request without a method name and params object")
        reply: dict[str, Any] = {"op": "rpc_result", "id": request_id, "value": None, "error": None}
        if method == FINAL_METHOD:
            reply["error"] = self._submit_final(params, run)
        elif method not in self._rpc_methods:
            reply["error"] = f"unknown method {method[:100]!r}"
        elif self._handler is None:
            reply["error"] = f"{method} is not available in this sandbox (no handler)"
        else:
            timeout = min(self.config.rpc_timeout_s, hard_deadline - asyncio.get_running_loop().time())
            try:
                value = await asyncio.wait_for(self._handler(method, params), max(timeout, 0))
                json.dumps(value)
                reply["value"] = value
            except asyncio.TimeoutError:
                if timeout < self.config.rpc_timeout_s:
                    raise  # the step's budget ran out, not the handler's own limit
                reply["error"] = f"no answer within {self.config.rpc_timeout_s:g} s"
            except Exception as exc:  # the handler's failure is reported to the model code, not raised here
                reply["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        return reply

    def _submit_final(self, params: dict, run: _Run) -> str | None:
        """Record the answer of ``FINAL``/``FINAL_VAR`` for this execution; returns a refusal or None."""
        answer = params.get("answer")
        if not isinstance(answer, str):
            raise ProtocolViolation("a FINAL request without an answer string")
        limit = self.config.max_answer_chars
        if len(answer) > limit:
            return (f"the final answer has {len(answer):,} characters, over the limit of {limit:,}; "
                    "it was not submitted")
        run.final_answer = protocol.text_field(params, "answer", limit)
        return None

    async def _restart_after(self, worker: Worker, reason: str, started: float,
                             timed_out: bool = False) -> ExecResult:
        await self._abandon(worker)
        await self._start()
        result = _failure(f"{reason} {_RESTART_NOTE}", started, timed_out=timed_out)
        result.sandbox_restarted = True
        return result


def shared_pool(config: SandboxConfig) -> WorkerPool:
    """The process-wide pool of REPL workers started the way ``config`` asks."""
    return WorkerPool.shared(REPL_PROGRAM, config.limits(), config.backend, config.pool_size, image=config.image)


def _check_subprocesses_allowed(config: SandboxConfig, pool: WorkerPool) -> None:
    if not config.allow_subprocesses:
        return
    if not get_backend(pool.backend).holds_children:
        holders = ", ".join(name for name, backend in registered().items() if backend.holds_children)
        raise SandboxError(f"allow_subprocesses needs a backend that holds child processes (installed here: "
                           f"{holders or 'none'}): a child process would escape the {pool.backend!r} backend's "
                           "in-process policy")
    if os.geteuid() == 0 and cgroup_support() is None:
        raise SandboxError("allow_subprocesses is refused when running as root without a writable cgroup: the "
                           "kernel exempts root's processes from RLIMIT_NPROC, so max_processes could not stop "
                           "a fork bomb")


def _encode_context(context: Any) -> tuple[str, bytes]:
    """The context file for the worker: plain text for a string (fast to load), else JSON."""
    if isinstance(context, str):
        return "context.txt", context.encode("utf-8", "surrogatepass")
    try:
        return "context.json", json.dumps(context).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"context must be JSON data (str, list, dict, numbers): {exc}") from None


def _failure(error: str, started: float, timed_out: bool = False) -> ExecResult:
    return ExecResult(stdout="", stderr="", error=error, timed_out=timed_out, truncated_chars=0, final_answer=None,
                      duration_s=time.monotonic() - started, sandbox_restarted=False, subcall_wait_s=0.0)
