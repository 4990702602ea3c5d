"""Futures: every queued request gets an id at once; clients poll ``retrieve_future`` for the result.

Results are protobuf bytes (``forward_backward`` and ``asample``, the two types the client reads only
as protobuf) or JSON objects. Worker threads finish futures; the HTTP handlers wait on them with
asyncio events set through the event loop, so a long poll holds no thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Result = bytes | dict[str, Any]


@dataclass
class Future:
    request_id: str
    session_id: str | None
    kind: str
    created: float = field(default_factory=time.monotonic)
    done: bool = False
    result: Result | None = None
    error: str | None = None
    category: str = "user"
    waiters: list[asyncio.Event] = field(default_factory=list)


class FutureStore:
    """Futures by request id. ``finish``/``fail`` may be called from any thread."""

    def __init__(self) -> None:
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def create(self, kind: str, session_id: str | None = None) -> Future:
        request_id = f"{next(self._ids)}-{uuid.uuid4().hex[:12]}"
        future = Future(request_id, session_id, kind)
        with self._lock:
            self._futures[request_id] = future
        return future

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
            future.result, future.error, future.category, future.done = result, error, category, True
            waiters, future.waiters = future.waiters, []
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

    def prune(self, max_age: float, now: float | None = None) -> int:
        """Drop finished futures older than ``max_age`` seconds (a client retrieves a result within
        seconds; the rest would pile up over a long run); returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [k for k, f in self._futures.items() if f.done and now - f.created > max_age]
            for key in gone:
                del self._futures[key]
        return len(gone)

    def forget_session(self, session_id: str) -> int:
        """Drop the futures of a reaped session; returns how many."""
        with self._lock:
            gone = [k for k, f in self._futures.items() if f.session_id == session_id]
            for key in gone:
                del self._futures[key]
        return len(gone)

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
        return f"unknown model id {exc.args[0]!r}" if exc.args else "unknown model id"
    return str(exc)
