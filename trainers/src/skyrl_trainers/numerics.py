"""What a run's numbers are: the precision it trains in, and whether its sampler's logprobs match the trainer's.

``trainer.off_policy.tis: auto`` turns on token-level TIS exactly where they do not (see
:func:`sampling_mismatch`); the trainer decides it once, before its ranks are built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from skyrl_trainers.engine_setup import engine_config_for_policy
from skyrl_trainers.engines.hf import HFEngineConfig, resolve_device, resolve_packed_dtype
from skyrl_trainers.models import resolve_dtype
from skyrl_trainers.precision import resolve_precision
from skyrl_trainers.worker import resolve_device as trainer_device


def sampling_mismatch(config: Any) -> str | None:
    """Why the rollout's logprobs differ from what the trainer computes for the same tokens, or None when
    they agree to float32 rounding (``config``: a resolved run config). ``trainer.off_policy.tis=auto``
    corrects with token-level TIS exactly when this returns a reason."""
    cfg = config.trainer
    if cfg.mode != "sync":
        return f"trainer.mode={cfg.mode} samples with an older policy"
    engine = engine_config_for_policy(config)
    if not isinstance(engine, HFEngineConfig):
        return f"engine {config.engine_id!r} computes its logprobs with kernels of its own"
    device = resolve_device(engine.device)
    if resolve_precision(cfg.precision, trainer_device(cfg.device)).bf16:
        return "the trainer computes in bf16"
    if resolve_dtype(engine.dtype, device) != torch.float32:
        return f"the hf engine's model is {resolve_dtype(engine.dtype, device)}"
    if device == "cpu" and engine.packed_weights is not False and resolve_packed_dtype(engine.packed_dtype) != \
            torch.float32:
        return "the hf engine samples with bf16 weights"
    return None


def resolve_tis(config: Any) -> tuple[str, str | None]:
    """``trainer.off_policy.tis`` with ``auto`` decided, and the mismatch that decided it (or None)."""
    chosen, reason = config.trainer.off_policy.tis, sampling_mismatch(config)
    if chosen != "auto":
        return chosen, reason
    return ("token" if reason else "none"), reason


def decide_numerics(config: Any) -> tuple[Any, list[str]]:
    """``config`` with its trainer section's ``precision`` and ``off_policy.tis`` decided where they were
    ``auto`` (so every rank, and an engine built from it in any process, computes in the precision the
    driver chose), and the lines a run prints about what it computes in and why (the precision always;
    the correction when ``auto`` turned it on)."""
    cfg = config.trainer
    precision = resolve_precision(cfg.precision, trainer_device(cfg.device))
    lines = [precision.describe()]
    tis, reason = resolve_tis(config)
    if cfg.off_policy.tis == "auto" and reason:
        lines.append(f"rollout logprobs: token-level TIS corrects them, because {reason} "
                     "(trainer.off_policy.tis=none turns it off)")
    trainer = cfg.model_copy(update={"precision": "bf16" if precision.bf16 else "fp32",
                                     "off_policy": cfg.off_policy.model_copy(update={"tis": tis})})
    return dataclasses.replace(config, trainer=trainer), lines
