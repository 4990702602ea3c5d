"""The one start-up path of every kind of sandbox worker, driven from a loop and from a thread, on every backend."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from skyrl_sandbox import (
    BlockingChannel,
    Limits,
    SandboxError,
    WorkerPool,
    WorkerProgram,
    WorkerSetup,
    start_worker,
    start_worker_blocking,
)
from skyrl_sandbox.box import AGENT_PROGRAM
from skyrl_sandbox.testing import require_backend

TIGHT = Limits(cpu_time_s=20, memory_mb=512, max_processes=32, tmp_size_mb=32)
BROKEN = WorkerProgram(module="skyrl_no_such_module", packages={})


def agent_setup(**overrides) -> WorkerSetup:
    """The command agent's start-up (it answers ``ping``)."""
    fields = {"prepare": lambda worker: {"work_dir": worker.plan.inside_tmp, "env": {}}, **overrides}
    return WorkerSetup("test", TIGHT, allow_subprocesses=True, pin_signals=False, **fields)


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children = [int(child) for task in os.listdir(f"/proc/{pid}/task")
                for child in open(f"/proc/{pid}/task/{task}/children").read().split()]
    return [pid, *(process for child in children for process in tree(child))]


def ping(channel: BlockingChannel, number: int) -> dict:
    channel.send({"op": "ping", "id": number}, time.monotonic() + 10)
    return channel.receive(time.monotonic() + 10)


def test_a_worker_started_from_a_thread_answers_over_its_blocking_channel(backend):
    pool = WorkerPool(AGENT_PROGRAM, TIGHT, backend, size=0)
    worker, channel = start_worker_blocking(pool, agent_setup())
    try:
        assert [ping(channel, number)["id"] for number in (1, 2, 3)] == [1, 2, 3]
        assert not channel.has_unread_data()
        assert worker.running()
    finally:
        worker.discard()
        pool.close()
    assert not worker.running()


async def test_a_worker_started_from_a_loop_is_attached_and_initialised(backend):
    pool = await asyncio.to_thread(WorkerPool, AGENT_PROGRAM, TIGHT, backend, 0)
    worker = await start_worker(pool, agent_setup())
    try:
        worker.send({"op": "ping", "id": 7})
        assert (await asyncio.wait_for(worker.receive(), 10))["id"] == 7
    finally:
        await worker.wait()
        pool.close()


@pytest.mark.parametrize("driver", ["loop", "thread"])
def test_a_worker_that_cannot_start_is_an_error_naming_its_exit_and_stderr(backend, driver):
    pool = WorkerPool(BROKEN, TIGHT, backend, size=0)
    try:
        with pytest.raises(SandboxError) as caught:
            if driver == "loop":
                asyncio.run(start_worker(pool, agent_setup()))
            else:
                start_worker_blocking(pool, agent_setup())
    finally:
        pool.close()
    message = str(caught.value)
    assert message.startswith(f"the test sandbox worker ({backend}) exited with status 1 while starting"), message
    assert "No module named 'skyrl_no_such_module'" in message


@pytest.mark.parametrize("backend_name", ["bwrap", "subprocess"])
def test_a_frozen_spare_gives_up_at_the_callers_deadline_and_is_discarded(backend_name):
    require_backend(backend_name)
    pool = WorkerPool(AGENT_PROGRAM, TIGHT, backend_name, size=1)
    try:
        while pool.idle_count == 0:
            time.sleep(0.01)
        spare = pool.take_idle()
        for process in tree(spare.pid):
            os.kill(process, signal.SIGSTOP)
        pool._idle.append(spare)  # back where a caller finds it, frozen
        with pytest.raises(TimeoutError):
            start_worker_blocking(pool, agent_setup(), spare_deadline=time.monotonic() + 0.5)
        assert not spare.running()
        worker, channel = start_worker_blocking(pool, agent_setup(), spare_deadline=time.monotonic() + 30)
        assert ping(channel, 1)["id"] == 1
        worker.discard()
    finally:
        pool.close()
