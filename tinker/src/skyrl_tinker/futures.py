"""Futures: every queued request gets an id at once; clients poll ``retrieve_future`` for the result.

Results are protobuf bytes (``forward_backward`` and ``asample``, the two types the client reads only
as protobuf) or JSON objects. Worker threads finish futures; the HTTP handlers wait on them with
asyncio events set through the event loop, so a long poll holds no thread.

Samples of a sampling session also enter that session's completion log (:class:`CompletionLog`):
the client's one poller per sampling client long-polls ``retrieve_futures`` for which requests
finished since its cursor, instead of one ``retrieve_future`` long poll per request, then fetches
each payload once.

A future belongs to the tenant whose request made it; ``pending`` counts a tenant's unfinished ones
(its queued requests, for the per-tenant limit).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from skyrl_core.http_hygiene import shown

Result = bytes | dict[str, Any]


@dataclass
class Future:
    request_id: str
    tenant: str
    session_id: str | None
    kind: str
    created: float = field(default_factory=time.monotonic)
    done: bool = False
    result: Result | None = None
    error: str | None = None
    category: str = "user"
    waiters: list[asyncio.Event] = field(default_factory=list)
    target: Target | None = None  # the sampling session (and clone) whose completion log it enters


Target = tuple[str, int]  # (sampling_session_id, cloned_sampler_id)


@dataclass
class CompletionLog:
    """Finished requests of one sampling target in completion order; ``cursor`` counts them.

    Entries at or before the cursor a client sends back have been seen and are trimmed.
    """

    entries: list[tuple[int, Future]] = field(default_factory=list)
    cursor: int = 0
    waiters: list[asyncio.Event] = field(default_factory=list)


class FutureStore:
    """Futures by request id. ``finish``/``fail`` may be called from any thread."""

    def __init__(self) -> None:
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logs: dict[Target, CompletionLog] = {}
        self._pending: Counter[str] = Counter()  # unfinished futures per tenant

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def create(self, kind: str, tenant: str, session_id: str | None = None, target: Target | None = None) -> Future:
        future = Future(secrets.token_hex(16), tenant, session_id, kind, target=target)
        with self._lock:
            self._futures[future.request_id] = future
            self._pending[tenant] += 1
            if target is not None:
                self._logs.setdefault(target, CompletionLog())
        return future

    def pending(self, tenant: str) -> int:
        """How many of ``tenant``'s futures are not settled yet (queued or running)."""
        with self._lock:
            return self._pending[tenant]

    def get(self, request_id: str) -> Future | None:
        with self._lock:
            return self._futures.get(request_id)

    def finish(self, future: Future, result: Result) -> None:
        self._settle(future, result=result)

    def fail(self, future: Future, message: str, category: str = "user") -> None:
        self._settle(future, error=message, category=category)

    def _settle(self, future: Future, *, result: Result | None = None, error: str | None = None,
                category: str = "user") -> None:
        with self._lock:
            if future.done:  # the first outcome stays (a sample cancelled as it finished)
                return
            future.result, future.error, future.category, future.done = result, error, category, True
            self._pending[future.tenant] -= 1
            waiters, future.waiters = future.waiters, []
            log = self._logs.get(future.target) if future.target is not None else None
            if log is not None:
                log.cursor += 1
                log.entries.append((log.cursor, future))
                waiters, log.waiters = waiters + log.waiters, []
        if self._loop is not None:
            for event in waiters:
                self._loop.call_soon_threadsafe(event.set)

    async def wait(self, future: Future, timeout: float) -> bool:
        """True once the future is done; False after ``timeout`` seconds (the client polls again)."""
        event = asyncio.Event()
        with self._lock:
            if future.done:
                return True
            future.waiters.append(event)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        return future.done

    async def completions(self, target: Target, prev_cursor: int, timeout: float,
                          retrieved: list[str]) -> tuple[list[Future], int]:
        """Requests of ``target`` finished after ``prev_cursor`` and the new cursor, waiting up to
        ``timeout`` seconds for one when there is none (0: answer at once). Entries up to
        ``prev_cursor`` are trimmed, and the futures in ``retrieved`` (payloads the client has read)
        are dropped."""
        event = asyncio.Event()
        with self._lock:
            log = self._logs.setdefault(target, CompletionLog())  # polled before its first sample
            log.entries = [(c, f) for c, f in log.entries if c > prev_cursor]
            for request_id in retrieved:
                future = self._futures.get(request_id)
                if future is not None and future.target == target and future.done:
                    del self._futures[request_id]
            if not log.entries and timeout > 0:
                log.waiters.append(event)
        if not event.is_set() and timeout > 0 and not log.entries:
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                pass
        with self._lock:
            found = [f for c, f in log.entries if c > prev_cursor]
            return found, max([c for c, _ in log.entries] + [prev_cursor])

    def forget_sampling_session(self, sampling_session_id: str) -> None:
        """Drop the completion logs of a sampling session (every clone)."""
        with self._lock:
            for target in [t for t in self._logs if t[0] == sampling_session_id]:
                del self._logs[target]

    def prune(self, max_age: float, now: float | None = None) -> int:
        """Drop finished futures older than ``max_age`` seconds (a client retrieves a result within
        seconds; the rest would pile up over a long run); returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [k for k, f in self._futures.items() if f.done and now - f.created > max_age]
            for key in gone:
                del self._futures[key]
        return len(gone)

    def forget_session(self, session_id: str) -> list[Future]:
        """Drop the futures of a reaped session; returns them."""
        with self._lock:
            gone = [f for f in self._futures.values() if f.session_id == session_id]
            for future in gone:
                del self._futures[future.request_id]
        return gone

    def run(self, future: Future, fn: Callable[[], Result]) -> None:
        """Settle ``future`` with ``fn()``; a ``ValueError``/``KeyError`` is the caller's fault, anything
        else the server's (the message says which)."""
        try:
            self.finish(future, fn())
        except (ValueError, KeyError) as exc:
            self.fail(future, _message(exc), "user")
        except Exception as exc:  # a failed request must never take the worker down
            self.fail(future, f"internal error: {type(exc).__name__}: {exc}", "server")


def _message(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"unknown model id {shown(exc.args[0])}" if exc.args else "unknown model id"
    return str(exc)
