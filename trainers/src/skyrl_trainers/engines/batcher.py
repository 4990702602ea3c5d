"""Collect concurrent async requests into batches and run each batch in one worker thread.

Requests that arrive while a batch is running wait for the next one (static batching per wave).
All batches, and any other work given to :meth:`RequestBatcher.run_exclusive` such as weight
updates, run on one thread in submission order, so they never overlap and the event loop stays free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from skyrl_core.engine import EngineError

Item = TypeVar("Item")
Result = TypeVar("Result")
BatchFn = Callable[[Sequence[Item]], Sequence["Result | BaseException"]]


class RequestBatcher(Generic[Item, Result]):
    """``await submit(item)`` returns that item's entry of ``run_batch([...items])``.

    ``run_batch`` returns one result per item; an exception in the list fails only its own request,
    an exception raised by ``run_batch`` fails the whole batch. After the first request of a batch,
    the batcher waits up to ``wait_s`` for more, up to ``max_batch_size``.
    """

    def __init__(self, run_batch: BatchFn, *, max_batch_size: int, wait_s: float, name: str = "batcher") -> None:
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.batch_sizes: list[int] = []
        # Queue and task belong to one event loop; a caller on a new loop (a later asyncio.run) gets new ones.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: list[asyncio.Future[Result]] = []

    async def submit(self, item: Item) -> Result:
        queue = self._ensure_running()
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        queue.put_nowait((item, future))
        return await future

    async def run_exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the batch thread, after the batches submitted before it."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def close(self) -> None:
        """Stop batching; requests still waiting or decoding fail with :class:`EngineError`."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            if loop.is_running() and _running_loop() is not loop:
                loop.call_soon_threadsafe(self._fail_pending)
            else:
                self._fail_pending()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _fail_pending(self) -> None:
        if self._task is not None:
            self._task.cancel()
        waiting = list(self._inflight)
        while self._queue is not None and not self._queue.empty():
            waiting.append(self._queue.get_nowait()[1])
        for fut in waiting:
            if not fut.done():
                fut.set_exception(EngineError("the engine was closed before this request finished"))

    def _ensure_running(self) -> asyncio.Queue[tuple[Item, asyncio.Future[Result]]]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._loop_forever(self._queue))
        assert self._queue is not None
        return self._queue

    async def _loop_forever(self, queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]]) -> None:
        while True:
            batch = await self._collect(queue)
            batch = [(item, fut) for item, fut in batch if not fut.cancelled()]
            if batch:
                await self._run(batch)

    async def _collect(self, queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]]
                       ) -> list[tuple[Item, asyncio.Future[Result]]]:
        batch = [await queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while len(batch) < self.max_batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        self.batch_sizes.append(len(batch))
        self._inflight = [fut for _, fut in batch]
        try:
            results = await self.run_exclusive(self.run_batch, [item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
