"""Tinker's built-in losses, per token, and the validation of their inputs.

Notation (per datum, per position ``t``): ``logp`` is the current policy's log-prob of
``target_tokens[t]``, ``q`` the sampler's (``loss_fn_inputs["logprobs"]``), ``A`` the advantage
(``loss_fn_inputs["advantages"]``), ``w`` the weight (``loss_fn_inputs["weights"]``, default 1),
``r = exp(logp - q)``. A datum's loss is the *sum* over its positions and a request's loss the sum
over its datums (Tinker does not normalise; the client scales advantages or weights to taste):

* ``cross_entropy``:       ``-w logp``
* ``importance_sampling``: ``-w r A``
* ``ppo``:                 ``-w min(r A, clip(r, lo, hi) A)`` (``clip_low_threshold`` lo = 0.8,
  ``clip_high_threshold`` hi = 1.2: absolute ratio bounds, mapped onto our ``ppo_clip_loss``)
* ``cispo``:               ``-w sg(clip(r, lo, hi)) A logp`` (same thresholds)
* ``dro``:                 ``-w (A logp - beta/2 (logp - q)^2)`` (``beta``, default 0.05)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from skyrl_core.http_hygiene import shown
from skyrl_trainers.algorithms.policy_losses import ppo_clip_loss

from skyrl_tinker.fields import FieldError, check_number

LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
LOSS_CONFIG: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
}
# (lo, hi) of each config value: ratio bounds around 1 (a ratio never passes e^20, see _LOG_RATIO_LIMIT), and a
# dro beta that keeps beta/2 (logp - q)^2 far from float32's limit
CONFIG_BOUNDS: dict[str, tuple[float, float]] = {"clip_low_threshold": (0.0, 1.0), "clip_high_threshold": (1.0, 1e9),
                                                 "beta": (0.0, 1e4)}
OPTIONAL_INPUTS = ("weights",)
SUPPORTED_LOSSES = tuple(LOSS_INPUTS)
_LOG_RATIO_LIMIT = 20.0  # as in our ppo_clip_loss: exp() never overflows on a stale sample


class LossInputError(ValueError):
    """A request whose loss name, config or inputs do not fit the loss; the message names the problem."""


@dataclass
class LossBatch:
    """Per-token inputs of a batch, right-padded to ``[n, W]``; ``valid`` is 1 on real positions."""

    targets: torch.Tensor
    weights: torch.Tensor
    valid: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: torch.device | str) -> LossBatch:
        return LossBatch(*(t.to(device) for t in (self.targets, self.weights, self.valid,
                                                   self.sampling_logprobs, self.advantages)))


def resolve_config(loss_fn: str, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """The loss's config with defaults filled in; unknown losses or keys, and values outside
    ``CONFIG_BOUNDS`` (judged as float32 by :func:`~skyrl_tinker.fields.check_number`), are errors."""
    if loss_fn not in LOSS_CONFIG:
        raise LossInputError(f"loss_fn {shown(loss_fn)} is not supported by skyrl-tinker; supported: "
                             f"{', '.join(SUPPORTED_LOSSES)}")
    resolved = dict(LOSS_CONFIG[loss_fn])
    for key, value in (config or {}).items():
        if key not in resolved:
            allowed = ", ".join(resolved) or "none"
            raise LossInputError(f"loss_fn_config key {shown(key)} is not used by {loss_fn!r} (accepted: {allowed})")
        try:
            resolved[key] = check_number(value, f"loss_fn_config[{key!r}]", *CONFIG_BOUNDS[key])
        except FieldError as exc:
            raise LossInputError(str(exc)) from None
    if "clip_low_threshold" in resolved and not resolved["clip_low_threshold"] <= resolved["clip_high_threshold"]:
        raise LossInputError("need clip_low_threshold <= clip_high_threshold, got "
                             f"{resolved['clip_low_threshold']} and {resolved['clip_high_threshold']}")
    return resolved


def check_datum(loss_fn: str, index: int, tokens: list[int], inputs: Mapping[str, np.ndarray],
                vocab_size: int) -> None:
    """Tinker's shape rules: every loss input is 1-D with one entry per input token."""
    n = len(tokens)
    if n == 0:
        raise LossInputError(f"datum {index}: model_input is empty")
    ids = np.asarray(tokens)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise LossInputError(f"datum {index}: model_input has token ids outside the vocabulary "
                             f"(size {vocab_size}): {bad[:5].tolist()}")
    required = LOSS_INPUTS[loss_fn]
    missing = [k for k in required if k not in inputs]
    if missing:
        raise LossInputError(f"datum {index}: loss {loss_fn!r} needs loss_fn_inputs {list(required)}, "
                             f"missing {missing}")
    unknown = [k for k in inputs if k not in required and k not in OPTIONAL_INPUTS]
    if unknown:
        raise LossInputError(f"datum {index}: loss_fn_inputs {shown(unknown)} are not used by {loss_fn!r} "
                             f"(accepted: {list(required) + list(OPTIONAL_INPUTS)})")
    for key, value in inputs.items():
        if value.shape != (n,):
            raise LossInputError(f"datum {index}: loss_fn_inputs[{shown(key)}] has shape {list(value.shape)}, "
                                 f"expected [{n}] (one entry per model_input token)")
        if not np.all(np.isfinite(value)):
            raise LossInputError(f"datum {index}: loss_fn_inputs[{shown(key)}] has NaN or infinite values")
    targets = inputs["target_tokens"]
    if not np.issubdtype(targets.dtype, np.integer) and not np.array_equal(targets, np.round(targets)):
        raise LossInputError(f"datum {index}: loss_fn_inputs['target_tokens'] must be whole token ids")
    bad = targets[(targets < 0) | (targets >= vocab_size)]
    if bad.size:
        raise LossInputError(f"datum {index}: target_tokens outside the vocabulary (size {vocab_size}): "
                             f"{bad[:5].tolist()}")


def loss_batch(data: list[Mapping[str, np.ndarray]], width: int) -> LossBatch:
    """Stack per-datum inputs into right-padded ``[n, width]`` tensors."""
    n = len(data)
    out = {k: torch.zeros(n, width) for k in ("weights", "valid", "logprobs", "advantages")}
    targets = torch.zeros(n, width, dtype=torch.long)
    for i, inputs in enumerate(data):
        k = len(inputs["target_tokens"])
        targets[i, :k] = torch.as_tensor(inputs["target_tokens"].astype(np.int64))
        out["valid"][i, :k] = 1.0
        out["weights"][i, :k] = torch.as_tensor(inputs["weights"]) if "weights" in inputs else 1.0
        for key in ("logprobs", "advantages"):
            if key in inputs:
                out[key][i, :k] = torch.as_tensor(inputs[key])
    return LossBatch(targets, out["weights"], out["valid"], out["logprobs"], out["advantages"])


def elementwise_loss(loss_fn: str, logp: torch.Tensor, batch: LossBatch, config: Mapping[str, float]) -> torch.Tensor:
    """``[n, W]`` per-token loss (zero on padding); the formulas are in the module docstring."""
    q, adv = batch.sampling_logprobs, batch.advantages
    if loss_fn == "cross_entropy":
        per_token = -logp
    elif loss_fn == "importance_sampling":
        per_token = -_ratio(logp, q) * adv
    elif loss_fn == "ppo":
        per_token = ppo_clip_loss(logp, q, adv, batch.valid, eps_low=1 - config["clip_low_threshold"],
                                  eps_high=config["clip_high_threshold"] - 1).loss
    elif loss_fn == "cispo":
        weight = _ratio(logp, q).clamp(config["clip_low_threshold"], config["clip_high_threshold"]).detach()
        per_token = -weight * adv * logp
    elif loss_fn == "dro":
        per_token = -(adv * logp - 0.5 * config["beta"] * (logp - q) ** 2)
    else:
        raise LossInputError(f"loss_fn {shown(loss_fn)} is not supported")
    return per_token * batch.weights * batch.valid


def _ratio(logp: torch.Tensor, sampling_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - sampling_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))
