"""The REPL's worker pool: pre-started workers, one shared pool per way of starting them."""

from __future__ import annotations

import asyncio

from skyrl_rlm_repl.sandbox import REPL_PROGRAM, Sandbox, SandboxConfig, shared_pool
from skyrl_sandbox import WorkerPool


async def test_pool_prestarts_workers_and_hands_them_out():
    pool = await asyncio.to_thread(WorkerPool, REPL_PROGRAM, SandboxConfig().limits(), size=2)
    try:
        for _ in range(200):
            if pool.idle_count == 2:
                break
            await asyncio.sleep(0.05)
        assert pool.idle_count == 2
        async with await Sandbox.create(SandboxConfig(), pool=pool) as sandbox:
            assert (await sandbox.execute("print(1)")).stdout == "1\n"
    finally:
        pool.close()
    assert pool.idle_count == 0


def test_shared_pool_is_one_per_way_of_starting_workers():
    assert shared_pool(SandboxConfig(cpu_time_s=30)) is shared_pool(SandboxConfig(cpu_time_s=90))
    assert shared_pool(SandboxConfig(tmp_size_mb=8)) is not shared_pool(SandboxConfig())
    # the worker's cgroup limits are set when it starts
    assert shared_pool(SandboxConfig(memory_mb=300)) is not shared_pool(SandboxConfig(memory_mb=900))
