"""Which precision a run computes in: bf16 where the hardware runs it natively, fp32 elsewhere.

On CUDA bf16 is the norm. On a CPU it pays only where the cores have bf16 instructions (AVX512-BF16
or AMX on Xeons since Cooper Lake / Sapphire Rapids), which run a bf16 matmul at about twice the fp32
rate: there a GRPO step of SmolLM2-135M takes 0.87 of its fp32 time (``bench/vs_trl.py``). Without
them oneDNN emulates bf16 and is slower than fp32, so ``auto`` keeps fp32 there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

#: /proc/cpuinfo flags of the bf16 instructions oneDNN uses, best first, with the name users know them by
BF16_CPU_FLAGS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))


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


def resolve_precision(requested: str, device_kind: str) -> Precision:
    """``trainer.precision`` (``auto``, ``fp32``, ``bf16``) on a ``cuda`` or ``cpu`` device."""
    if requested == "fp32":
        return Precision(False, "trainer.precision=fp32")
    if requested == "bf16":
        return Precision(True, "trainer.precision=bf16")
    if device_kind == "cuda":
        return Precision(True, "auto on CUDA")
    feature = cpu_bf16_feature()
    if feature:
        return Precision(True, f"auto: this CPU has {feature}; trainer.precision=fp32 turns it off")
    return Precision(False, "auto: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 would be slower")

