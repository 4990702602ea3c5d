"""Benchmark of the skyrl-rlm-repl sandbox against an in-process ``exec`` baseline measured in the same run.

Prints one table: sandbox start time (cold, and from the pre-started pool), execute round-trip
latency (p50/p99) for a trivial statement and for an access to a 1 MB ``context``, and execute
throughput with 1, 8 and 32 concurrent sandboxes. The baseline column runs the same code with
``exec`` in this process (what an unsandboxed REPL costs); the ratio says what isolation costs.

    python bench/rlm_repl_sandbox.py [--backend auto|bwrap|subprocess] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from skyrl_rlm_repl.sandbox import REPL_PROGRAM, Sandbox, SandboxConfig
from skyrl_sandbox import WorkerPool
from timing import percentile, timed

TRIVIAL = "x = 1"
CONTEXT_ACCESS = "n = len(context); part = context[500_000:500_100]"
WORK = "s = sum(range(200))"
MEGABYTE_CONTEXT = "abcdefghij" * 100_000



def in_process_exec_s(code: str, namespace: dict, repeat: int) -> list[float]:
    """Seconds per exec, compiling each time as the sandbox does."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        exec(compile(code, "<bench>", "exec"), namespace)
        samples.append(time.perf_counter() - started)
    return samples



async def start_times(config: SandboxConfig, pool: WorkerPool, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        while pool.size and pool.idle_count < pool.size:  # measure a pool that has had time to refill
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        sandbox = await Sandbox.create(config, context=MEGABYTE_CONTEXT, pool=pool)
        samples.append(time.perf_counter() - started)
        await sandbox.close()
    return samples


async def throughput(config: SandboxConfig, pool: WorkerPool, concurrency: int, per_sandbox: int) -> float:
    sandboxes = await asyncio.gather(*(Sandbox.create(config, pool=pool) for _ in range(concurrency)))
    try:
        async def drive(sandbox: Sandbox) -> None:
            for _ in range(per_sandbox):
                result = await sandbox.execute(WORK)
                assert result.error is None, result.error
        started = time.perf_counter()
        await asyncio.gather(*(drive(s) for s in sandboxes))
        return concurrency * per_sandbox / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


def baseline_throughput(executes: int) -> float:
    namespace: dict = {}
    started = time.perf_counter()
    in_process_exec_s(WORK, namespace, executes)
    return executes / (time.perf_counter() - started)


def row(name: str, sandbox: float, baseline: float, unit: str) -> str:
    ratio = sandbox / baseline if baseline else float("inf")
    return f"| {name:<38} | {sandbox:>12.3f} {unit:<7} | {baseline:>12.4f} {unit:<7} | {ratio:>10.1f}x |"


async def main(backend: str, quick: bool) -> None:
    scale = 4 if quick else 1
    config = SandboxConfig(backend=backend, exec_timeout_s=30, pool_size=0)
    cold_pool = await asyncio.to_thread(WorkerPool, REPL_PROGRAM, config.limits(), backend, 0)
    warm_pool = await asyncio.to_thread(WorkerPool, REPL_PROGRAM, config.limits(), backend, 4)
    ms = 1000.0

    cold = await start_times(config, cold_pool, 20 // scale)
    warm = await start_times(config, warm_pool, 20 // scale)
    baseline_start = in_process_exec_s("namespace = {'context': ctx}", {"ctx": MEGABYTE_CONTEXT}, 200)

    async with await Sandbox.create(config, context=MEGABYTE_CONTEXT, pool=warm_pool) as sandbox:
        await sandbox.execute(TRIVIAL)  # warm-up
        trivial = await timed(400 // scale, lambda: sandbox.execute(TRIVIAL))
        access = await timed(400 // scale, lambda: sandbox.execute(CONTEXT_ACCESS))
    base_trivial = in_process_exec_s(TRIVIAL, {}, 400)
    base_access = in_process_exec_s(CONTEXT_ACCESS, {"context": MEGABYTE_CONTEXT}, 400)

    rates = {n: await throughput(config, warm_pool, n, 200 // scale) for n in (1, 8, 32)}
    base_rate = baseline_throughput(2000)

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nskyrl-rlm-repl sandbox benchmark (backend: {cold_pool.backend}; baseline: in-process exec in this "
          f"run; {os.cpu_count()} CPUs, load average {load})\n")
    print(f"| {'metric':<38} | {'sandbox':>20} | {'in-process baseline':>20} | {'ratio':>11} |")
    print(f"|{'-' * 40}|{'-' * 22}|{'-' * 22}|{'-' * 13}|")
    print(row("start, cold (p50)", statistics.median(cold) * ms, statistics.median(baseline_start) * ms, "ms"))
    print(row("start, from pool (p50)", statistics.median(warm) * ms, statistics.median(baseline_start) * ms, "ms"))
    for name, samples, base in (("execute 'x = 1'", trivial, base_trivial),
                                ("execute 1 MB context access", access, base_access)):
        for q in (50, 99):
            print(row(f"{name} (p{q})", percentile(samples, q) * ms, percentile(base, q) * ms, "ms"))
    for n, rate in rates.items():
        # throughput: higher is better, so the ratio is baseline / sandbox (how many times slower)
        print(f"| {f'throughput, {n} concurrent sandboxes':<38} | {rate:>12.0f} exec/s  | {base_rate:>12.0f} exec/s  "
              f"| {base_rate / rate:>9.1f}x slower |")
    cold_pool.close()
    warm_pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", choices=["auto", "bwrap", "subprocess"])
    parser.add_argument("--quick", action="store_true", help="a quarter of the samples")
    args = parser.parse_args()
    asyncio.run(main(args.backend, args.quick))
