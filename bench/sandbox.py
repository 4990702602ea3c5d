"""Benchmark of skyrl-sandbox, per backend, beside unsandboxed baselines measured in the same run.

For each installed backend that works here (bwrap, docker, podman, subprocess): cold start (a new worker up to
its first reply), warm start (a box from a pre-started pool), a one-shot command round trip (``true``
through :meth:`Box.run`; on a container backend that is an exec of its engine), a long-lived worker round trip
(``Box.ping``, p50/p99) and round trips per second with 1, 8 and 32 concurrent boxes. Baselines:
an unsandboxed ``subprocess.run(["true"])`` for starts and one-shot commands, and the same framed
JSON message encoded and decoded in this process for worker round trips. Targets from the issue:
bwrap warm start <= 20 ms and execute p50 <= 0.5 ms; docker cold start <= 1 s and execute p50 <= 2 ms.

    python bench/sandbox.py [--backends bwrap,docker,podman,subprocess] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

from skyrl_sandbox import Limits, backend_problem
from skyrl_sandbox.box import Box
from skyrl_sandbox.framing import encode
from skyrl_sandbox.registry import backend_names, get_backend
from timing import percentile, timed

MS = 1000.0




def baseline_spawn(runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(["true"], check=True)
        samples.append(time.perf_counter() - started)
    return samples


def baseline_round_trip(runs: int) -> list[float]:
    samples = []
    message = {"op": "ping", "id": 1}
    for _ in range(runs):
        started = time.perf_counter()
        json.loads(encode(message)[4:])
        json.loads(encode({"op": "reply", "id": 1, "error": None})[4:])
        samples.append(time.perf_counter() - started)
    return samples


async def start_times(backend: str, limits: Limits, runs: int, pool_size: int) -> list[float]:
    samples = []
    if pool_size:  # the first box creates the pool and cannot find it filled yet
        await (await Box.create(backend, limits, pool_size=pool_size)).close()
    for _ in range(runs):
        if pool_size:
            await asyncio.sleep(0.3)  # let the pool refill, as it does between episodes
        started = time.perf_counter()
        box = await Box.create(backend, limits, pool_size=pool_size)
        await box.ping()
        samples.append(time.perf_counter() - started)
        await box.close()
    return samples


async def rate(backend: str, limits: Limits, concurrency: int, per_box: int) -> float:
    boxes = await asyncio.gather(*(Box.create(backend, limits) for _ in range(concurrency)))
    try:
        async def drive(box: Box) -> None:
            for _ in range(per_box):
                await box.ping()
        started = time.perf_counter()
        await asyncio.gather(*(drive(box) for box in boxes))
        return concurrency * per_box / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(box.close() for box in boxes))


async def engine_exec_times(box: Box, runs: int) -> list[float]:
    """An engine's exec of ``true`` in the box's container: what a backend without an attached worker would pay."""
    api, container = box._worker.api, box._worker.container_id

    def once() -> None:
        exec_id = api.exec_create(container, ["true"], user=str(box._worker.uid))["Id"]
        api.exec_start(exec_id)

    return await timed(runs, lambda: asyncio.to_thread(once))


def row(metric: str, value: float, base: float, unit: str) -> str:
    return f"| {metric:<42} | {value:>12.3f} {unit:<6} | {base:>12.3f} {unit:<6} | {value / base:>9.1f}x |"


async def bench_backend(backend: str, scale: int) -> list[str]:
    limits = Limits()
    cold = await start_times(backend, limits, 10 // scale, pool_size=0)
    warm = await start_times(backend, limits, 10 // scale, pool_size=2)
    spawn = baseline_spawn(50)
    async with await Box.create(backend, limits) as box:
        await box.run(["true"])
        one_shot = await timed(100 // scale, lambda: box.run(["true"]))
        await box.ping()
        round_trip = await timed(1000 // scale, box.ping)
        engine_exec = await engine_exec_times(box, 40 // scale) if get_backend(backend).engine else None
    base_trip = baseline_round_trip(1000)
    rows = [row(f"{backend}: cold start (p50)", statistics.median(cold) * MS, statistics.median(spawn) * MS, "ms"),
            row(f"{backend}: warm start from pool (p50)", statistics.median(warm) * MS, statistics.median(spawn) * MS,
                "ms"),
            row(f"{backend}: one-shot run 'true' (p50)", statistics.median(one_shot) * MS,
                statistics.median(spawn) * MS, "ms")]
    if engine_exec:
        rows.append(row(f"{backend}: one-shot engine exec `true` (p50)", statistics.median(engine_exec) * MS,
                        statistics.median(spawn) * MS, "ms"))
    for q in (50, 99):
        rows.append(row(f"{backend}: worker round trip (p{q})", percentile(round_trip, q) * MS,
                        percentile(base_trip, q) * MS, "ms"))
    base_rate = 1 / statistics.mean(base_trip)
    for n in (1, 8, 32):
        per_second = await rate(backend, limits, n, 400 // scale)
        rows.append(f"| {f'{backend}: {n} concurrent boxes':<42} | {per_second:>12.0f} trip/s | "
                    f"{base_rate:>12.0f} trip/s | {base_rate / per_second:>6.1f}x slower |")
    return rows


async def main(backends: list[str], quick: bool) -> None:
    scale = 4 if quick else 1
    rows, skipped = [], []
    for backend in backends:
        problem = backend_problem(backend)
        if problem:
            skipped.append(f"{backend}: {problem}")
            continue
        rows += await bench_backend(backend, scale)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nskyrl-sandbox benchmark (baselines: unsandboxed subprocess.run(['true']) for starts and one-shot runs, "
          f"in-process framing for round trips; {os.cpu_count()} CPUs, load average {load})\n")
    print(f"| {'metric':<42} | {'sandbox':>19} | {'baseline':>19} | {'ratio':>10} |")
    print(f"|{'-' * 44}|{'-' * 21}|{'-' * 21}|{'-' * 12}|")
    print("\n".join(rows))
    for line in skipped:
        print(f"\nnot measured: {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(backend_names()),
                        help="comma-separated backends to measure (those that cannot run here are listed, not timed)")
    parser.add_argument("--quick", action="store_true", help="a quarter of the samples")
    args = parser.parse_args()
    asyncio.run(main(args.backends.split(","), args.quick))
