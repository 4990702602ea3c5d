"""skyrl_core.peer_loop: one background loop per process for peers whose async state outlives a call."""

from __future__ import annotations

import asyncio
import os

import pytest
from skyrl_core import peer_loop


async def _where() -> int:
    return id(asyncio.get_running_loop())


def test_sync_and_async_callers_reach_the_same_loop_which_keeps_state_across_calls():
    queue_holder: dict[str, asyncio.Queue] = {}

    async def open_queue() -> None:
        queue_holder["q"] = asyncio.Queue()  # bound to the loop it was made on

    async def put(value: int) -> None:
        await queue_holder["q"].put(value)

    async def take() -> int:
        return await queue_holder["q"].get()

    peer_loop.run(open_queue(), timeout=5)
    peer_loop.run(put(7), timeout=5)

    async def from_another_loop() -> tuple[int, int]:
        return await peer_loop.arun(take(), timeout=5), await peer_loop.arun(_where(), timeout=5)

    value, loop_id = asyncio.run(from_another_loop())
    assert value == 7 and loop_id == peer_loop.run(_where(), timeout=5) == id(peer_loop.peer_loop())


def test_a_call_past_its_timeout_is_cancelled_and_raises_timeout_error():
    state = {"cancelled": False}

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    with pytest.raises(TimeoutError, match="no result within 0.2 s"):
        peer_loop.run(forever(), timeout=0.2)
    with pytest.raises(TimeoutError):
        asyncio.run(peer_loop.arun(forever(), timeout=0.2))
    peer_loop.run(asyncio.sleep(0.05), timeout=5)  # let the cancellations land
    assert state["cancelled"]


def test_a_forked_child_gets_a_loop_of_its_own():
    parent = id(peer_loop.peer_loop())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread does not exist here
        try:
            answered = peer_loop.run(_where(), timeout=5)  # would hang on the parent's loop, which has no thread here
            os.write(write, b"1" if answered != parent else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
