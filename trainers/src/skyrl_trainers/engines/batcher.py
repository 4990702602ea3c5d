"""Feed concurrent async requests to one worker thread that decodes them as a continuous batch.

Callers on any event loop ``await submit(item)``. One worker thread runs ``decode(items, session)``
with the requests waiting at that moment (after up to ``wait_s`` for more to arrive; with ``max_wait_s``
above it, the wait restarts at each arrival, up to ``max_wait_s`` in all, so a burst that trickles in
over HTTP starts as one batch instead of joining a running one request by request). Between decode
steps the decoder may admit newly arrived requests with ``session.take(n)``, and it hands each
finished request to ``session.deliver(item, result)`` straight away, so a short answer never waits
for a long one; a request whose caller stopped waiting (``session.abandoned(item)``) may end early.
Work given to :meth:`ContinuousBatcher.run_exclusive` (weight updates) runs on the same thread: the
decoder stops admitting requests, finishes the ones in flight, then the work runs before any further
decoding, so a batch never sees half-updated weights. Work given to
:meth:`ContinuousBatcher.run_between_steps` (in-flight weight updates) runs on that thread too, but
without draining: the decoder calls ``session.between_steps()`` before each decode step, which runs
it there (and at once when no decode is running).
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from skyrl_core.engine import EngineError

Item = TypeVar("Item")
Result = TypeVar("Result")


class Session(Protocol[Item, Result]):
    """What a decoder sees of the batcher while it runs."""

    @property
    def closed(self) -> bool: ...

    def take(self, limit: int) -> list[Item]: ...

    def deliver(self, item: Item, result: Result | BaseException) -> None: ...

    def between_steps(self) -> int: ...

    def abandoned(self, item: Item) -> bool: ...


@dataclass
class _Pending(Generic[Item, Result]):
    item: Item
    future: asyncio.Future[Result]
    loop: asyncio.AbstractEventLoop


class ContinuousBatcher(Generic[Item, Result]):
    """``await submit(item)`` resolves to what ``decode`` delivers for that item.

    ``decode`` must deliver every item it was given or took; an exception it raises fails the
    requests it has not delivered yet, and the batcher keeps serving new ones.
    """

    def __init__(self, decode: Callable[[list[Item], Session[Item, Result]], None], *, max_batch_size: int,
                 wait_s: float, max_wait_s: float = 0.0, name: str = "batcher") -> None:
        self.decode = decode
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.max_wait_s = max(wait_s, max_wait_s)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.batch_sizes: list[int] = []  # requests each decode started with
        self.joined = 0  # requests admitted into a batch that was already decoding
        self._cond = threading.Condition()
        self._inbox: deque[_Pending[Item, Result]] = deque()
        self._inflight: dict[int, _Pending[Item, Result]] = {}
        self._between: deque[_Pending[tuple[Callable[..., Any], Sequence[Any]], Any]] = deque()
        self._draining = False
        self._exclusive_waiting = 0
        self._closed = False

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        with self._cond:
            if self._closed:
                raise EngineError("the engine is closed")
            self._inbox.append(_Pending(item, future, loop))
            self._cond.notify()
            start = not self._draining
            self._draining = True
        if start:
            self.executor.submit(self._drain)
        return await future

    async def run_exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the decode thread once the requests in flight have finished."""
        with self._cond:
            self._exclusive_waiting += 1
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._exclusive, fn, args)

    async def run_between_steps(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the decode thread between two decode steps, without draining the batch.

        A running decode runs it when it next calls ``session.between_steps()`` (before each step);
        when no decode is running it runs at once (after whatever the thread is doing). The decoder
        sees what ``fn`` changed from its next step on (e.g. new weights for the rows in flight).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._cond:
            if self._closed:
                raise EngineError("the engine is closed")
            self._between.append(_Pending((fn, args), future, loop))
        self.executor.submit(self.between_steps)
        return await future

    def close(self) -> None:
        """Stop; requests still waiting or decoding fail with :class:`EngineError`."""
        with self._cond:
            self._closed = True
            pending = [*self._inbox, *self._inflight.values(), *self._between]
            self._inbox.clear()
            self._inflight.clear()
            self._between.clear()
            self._cond.notify_all()
        for p in pending:
            _resolve(p, EngineError("the engine was closed before this request finished"))
        self.executor.shutdown(wait=False, cancel_futures=True)

    # --- the session the decoder sees ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def take(self, limit: int) -> list[Item]:
        """Requests that arrived since the batch started (none while an exclusive job waits)."""
        with self._cond:
            if self._exclusive_waiting or self._closed:
                return []
            items = self._take_locked(limit)
        self.joined += len(items)
        return items

    def deliver(self, item: Item, result: Result | BaseException) -> None:
        with self._cond:
            pending = self._inflight.pop(id(item), None)
        if pending is not None:
            _resolve(pending, result)

    def abandoned(self, item: Item) -> bool:
        """True once nobody waits for ``item`` any more (its ``submit`` was cancelled): the decoder may
        stop working on it (what it then delivers for it goes nowhere)."""
        with self._cond:
            pending = self._inflight.get(id(item))
        return pending is None or pending.future.cancelled()

    def between_steps(self) -> int:
        """Run the work queued by :meth:`run_between_steps` (on the decode thread); returns how many ran.

        An exception goes to the caller of that work, not to the decoder.
        """
        ran = 0
        while True:
            with self._cond:
                if not self._between:
                    return ran
                job = self._between.popleft()
            fn, args = job.item
            try:
                result = fn(*args)
            except Exception as exc:  # noqa: BLE001 - handed to the caller of run_between_steps
                result = exc
                traceback.clear_frames(exc.__traceback__)
            _resolve(job, result)
            ran += 1

    # --- the worker thread -----------------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            with self._cond:
                if self._closed or self._exclusive_waiting or not self._inbox:
                    # Requests left behind an exclusive job get a new drain queued after it.
                    self._draining = bool(self._inbox) and not self._closed
                    if self._draining:
                        self.executor.submit(self._drain)
                    return
                items = self._take_locked(self.max_batch_size)
                start = time.monotonic()
                deadline = start + self.wait_s
                while len(items) < self.max_batch_size and not self._closed:
                    if self._inbox:
                        items += self._take_locked(self.max_batch_size - len(items))
                        if self.max_wait_s > self.wait_s:  # a new arrival: wait again for the next one
                            deadline = min(time.monotonic() + self.wait_s, start + self.max_wait_s)
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._cond.wait(remaining):
                        break
            self.batch_sizes.append(len(items))
            try:
                self.decode(items, self)
            except Exception as exc:  # noqa: BLE001 - handed to the callers of this batch
                self._fail_inflight(exc)
                # The callers keep the exception; its frames must not keep the batch's KV cache alive.
                traceback.clear_frames(exc.__traceback__)

    def _exclusive(self, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
        with self._cond:
            self._exclusive_waiting -= 1
        return fn(*args)

    def _take_locked(self, limit: int) -> list[Item]:
        items = []
        while self._inbox and len(items) < limit:
            pending = self._inbox.popleft()
            if pending.future.cancelled():
                continue
            self._inflight[id(pending.item)] = pending
            items.append(pending.item)
        return items

    def _fail_inflight(self, exc: BaseException) -> None:
        with self._cond:
            pending = list(self._inflight.values())
            self._inflight.clear()
        for p in pending:
            _resolve(p, exc)


def _resolve(pending: _Pending[Any, Any], result: Any) -> None:
    def settle() -> None:
        if pending.future.done():
            return
        if isinstance(result, BaseException):
            pending.future.set_exception(result)
        else:
            pending.future.set_result(result)

    try:
        pending.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's event loop is already closed: nobody is waiting
        pass
