"""Which precision a run computes in: bf16 where the hardware runs it faster, fp32 elsewhere.

On CUDA bf16 is the norm. On a CPU it pays only where the cores run bf16 matmuls faster than fp32
ones. The flags are not enough: bf16 instructions (AVX512-BF16, AMX) are needed, but a CPU that lists
AVX512-BF16 and no AMX was measured at half the fp32 rate in bf16 (oneDNN's ``avx512_core_bf16``
kernels: 154 against 266 GFLOP/s on 2 cores), and a GRPO step there took 1.7x its fp32 time
(``bench/vs_trl.py``), while another with the same flags ran bf16 at twice the fp32 rate. So ``auto``
measures: a CPU with the instructions runs a short matmul probe in both precisions, once per process,
and takes bf16 only when it is clearly faster.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: /proc/cpuinfo flags of the bf16 instructions oneDNN uses, best first, with the name users know them by
BF16_CPU_FLAGS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))
#: how many times the fp32 rate a CPU's bf16 matmuls must reach for ``auto`` to choose bf16; measured
#: ratios fall far on either side (0.5x to 0.6x, 2x and more), so load on the machine does not flip it
BF16_MIN_SPEEDUP = 1.25


@dataclass(frozen=True)
class Precision:
    """The resolved choice: ``bf16`` autocast (fp32 master weights) or not, and one line saying why."""

    bf16: bool
    reason: str

    def describe(self) -> str:
        return f"precision: {'bf16 mixed, fp32 master weights' if self.bf16 else 'fp32'} ({self.reason})"


@functools.cache
def cpu_bf16_feature(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The name of this CPU's native bf16 instructions (``AMX``, ``AVX512-BF16``), or None without them
    (or where ``/proc/cpuinfo`` does not exist, e.g. macOS: fp32 is the safe choice there)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return next((name for flag, name in BF16_CPU_FLAGS if flag in flags), None)


def bf16_matmul_speedup(size: int = 512, rounds: int = 15) -> float:
    """How many times faster one core of this CPU multiplies ``size``-square matrices in bf16 than in
    fp32: the best of ``rounds`` timings of each, taken in turn. One thread, because a busy machine then
    only delays some timings, and the best ones stay clean (with two threads on two busy cores the ratio
    scattered from 0.4 to 1.1 where one thread gave 0.53 every time). About 0.1 s."""
    import torch  # here, not at the top: reading the flags needs no torch

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator) for _ in range(2))
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for x, y in pairs.values():
            torch.mm(x, y)  # oneDNN builds each kernel on its first call
        times: dict[Any, list[float]] = {dtype: [] for dtype in pairs}
        for _ in range(rounds):
            for dtype, (x, y) in pairs.items():
                start = time.perf_counter()
                torch.mm(x, y)
                times[dtype].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return min(times[torch.float32]) / min(times[torch.bfloat16])


@functools.cache
def cpu_auto_precision() -> Precision:
    """``auto`` on this CPU: bf16 where it has the instructions and its bf16 matmuls ran at least
    :data:`BF16_MIN_SPEEDUP` times the fp32 rate; decided once per process, so every caller agrees."""
    feature = cpu_bf16_feature()
    if not feature:
        return Precision(False, "auto: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 would be slower")
    speedup = bf16_matmul_speedup()
    if speedup < BF16_MIN_SPEEDUP:
        return Precision(False, f"auto: this CPU has {feature}, but its bf16 matmuls ran at {speedup:.2f}x the fp32 "
                                "rate here; trainer.precision=bf16 forces bf16")
    return Precision(True, f"auto: this CPU has {feature}, whose bf16 matmuls ran at {speedup:.1f}x the fp32 rate "
                           "here; trainer.precision=fp32 turns it off")


def resolve_precision(requested: str, device_kind: str) -> Precision:
    """``trainer.precision`` (``auto``, ``fp32``, ``bf16``) on a ``cuda`` or ``cpu`` device."""
    if requested == "fp32":
        return Precision(False, "trainer.precision=fp32")
    if requested == "bf16":
        return Precision(True, "trainer.precision=bf16")
    if device_kind == "cuda":
        return Precision(True, "auto on CUDA")
    return cpu_auto_precision()

