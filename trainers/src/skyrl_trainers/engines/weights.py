"""Copy named tensors from a trainer into a model's parameters and buffers, in place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from skyrl_core.registry import did_you_mean

# Wrappers that prefix parameter names (torch.compile, DDP/DataParallel, FSDP1, activation checkpointing).
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def copy_named_tensors(model: torch.nn.Module,
                       named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
    """Copy each ``(name, tensor)`` into the model's tensor of that name; returns how many were copied.

    Every name and shape is checked before anything is written, so a bad update leaves the model
    unchanged. Sharded ``DTensor`` values are gathered with ``full_tensor()`` (a collective: call it
    on every rank). Tied weights (e.g. ``lm_head.weight``) may be sent under either name.
    """
    targets = model.state_dict(keep_vars=True)
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    plan = []
    for name, value in items:
        key = strip_wrapper_prefixes(name)
        target = targets.get(key)
        if target is None:
            raise KeyError(f"update_weights: the model has no parameter {name!r}.{did_you_mean(key, list(targets))}")
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"update_weights: {name!r} has shape {tuple(value.shape)}, "
                             f"the model expects {tuple(target.shape)}")
        plan.append((target, value))
    with torch.no_grad():
        for target, value in plan:
            target.copy_(value.detach())
    return len(plan)


def strip_wrapper_prefixes(name: str) -> str:
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name
