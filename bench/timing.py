"""Timing helpers shared by the benchmarks: percentiles and timed calls."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def timed(calls: int, step: Callable[[], Awaitable[object]]) -> list[float]:
    """Seconds each of ``calls`` awaited calls of ``step`` took."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await step()
        samples.append(time.perf_counter() - started)
    return samples
