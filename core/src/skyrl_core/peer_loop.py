"""One background event loop per process, for peer libraries whose async objects outlive a call.

Most envs need none: :meth:`~skyrl_core.env.TextEnv.areset` and :meth:`~skyrl_core.env.TextEnv.astep` run on the
caller's loop. A bridge needs one loop that outlives a call when the peer holds async state across turns: a
peer's own episode loop that drives the policy turn by turn (verifiers' ``Env.run``), or a WebSocket client
bound to the loop it connected on (OpenEnv). Such a bridge submits its coroutines here from sync and async
callers alike. The loop runs on a daemon thread and is made anew in a forked child.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None
_lock = threading.Lock()


def peer_loop() -> asyncio.AbstractEventLoop:
    """The process's background loop, started on first use (and again in a forked child)."""
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or _loop.is_closed():
            _loop, _pid = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=_loop.run_forever, name="skyrl-peer-loop", daemon=True).start()
        return _loop


def submit(coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule ``coroutine`` on the background loop and return its future at once."""
    return asyncio.run_coroutine_threadsafe(coroutine, peer_loop())


def run(coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
    """``coroutine``'s result, waited for from sync code; cancelled and ``TimeoutError`` after ``timeout`` s."""
    future = submit(coroutine)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no result within {timeout:g} s") from None


async def arun(coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
    """``coroutine``'s result, awaited from another loop; cancelled and ``TimeoutError`` after ``timeout`` s."""
    future = submit(coroutine)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except (TimeoutError, asyncio.TimeoutError):
        future.cancel()
        raise TimeoutError(f"no result within {timeout:g} s") from None
