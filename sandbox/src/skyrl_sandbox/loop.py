"""One background event loop, per process, that owns every sandbox.

Sandboxes hold subprocess pipes bound to the loop that created them, while an env may be stepped
from many loops: ``step()`` (no loop), ``asyncio.run(env.astep(...))`` (a throwaway loop) or a
generator's loop. Running all sandbox I/O on one long-lived loop makes all of these work and lets
``close()`` always shut a sandbox down, whichever thread calls it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def sandbox_loop() -> asyncio.AbstractEventLoop:
    """The shared loop, started on first use in a daemon thread."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="skyrl-sandboxes", daemon=True).start()
            _loop = loop
        return _loop


def on_sandbox_loop() -> bool:
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


async def run_on_sandbox_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the shared loop from any loop (cancelling the caller cancels it)."""
    if on_sandbox_loop():
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, sandbox_loop()))


def run_on_sandbox_loop_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the shared loop and block this thread until it is done."""
    if on_sandbox_loop():
        coro.close()
        raise RuntimeError("blocking call made from the sandbox loop itself")
    future = asyncio.run_coroutine_threadsafe(coro, sandbox_loop())
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise
