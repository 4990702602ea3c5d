"""LoRA on the policy with ``peft``: wrap the model, and turn base + adapters back into plain weights.

The trainer trains a ``peft`` model (frozen base, trainable ``lora_A``/``lora_B``), while engines and
exports want an ordinary Hugging Face model. :func:`merged_state_dict` gives that model's weights
under their plain names, each adapted layer's weight being ``W + scaling * B @ A`` (peft's
``get_delta_weight``; checked against ``merge_and_unload`` in the tests). It works from a full state
dict, so it serves a sharded policy (gathered first) as well as a single rank's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from skyrl_core.factory import ConfigError
from skyrl_core.registry import did_you_mean

from skyrl_trainers.config import LoRAConfig

ADAPTER = "default"  # peft's name for the one adapter we train
PEFT_PREFIX = "base_model.model."  # what peft puts before the wrapped model's own parameter names


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> Any:
    """``model`` wrapped by ``peft`` with trainable adapters on ``cfg.target_modules``; every base
    parameter is frozen. Targets that match no layer are a :class:`ConfigError` naming the field."""
    from peft import LoraConfig, get_peft_model

    if not isinstance(cfg.target_modules, str):
        _check_target_names(model, cfg.target_modules)
    config = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                        target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(f"trainer.lora.target_modules={cfg.target_modules!r}: {exc}") from None


def _check_target_names(model: torch.nn.Module, targets: list[str]) -> None:
    """peft matches a listed name against the end of each module's dotted name."""
    names = [name for name, _ in model.named_modules() if name]
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in names):
            raise ConfigError(f"trainer.lora.target_modules: no layer of {type(model).__name__} is called "
                              f"{target!r}.{did_you_mean(target, linear)} Its linear layers: {', '.join(linear)}")


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def merged_state_dict(policy: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Plain Hugging Face weights from ``state``, a full (unsharded) state dict of the peft ``policy``.

    Names lose peft's ``base_model.model.`` prefix and ``.base_layer`` part; the adapter tensors are
    folded into their layers' weights (in float32, cast back to the weight's dtype) and not returned.
    Tensors of layers without adapters are passed through, not copied.
    """
    from peft.tuners.lora import LoraLayer

    merged: dict[str, torch.Tensor] = {}
    folded: set[str] = set()
    for name, layer in policy.named_modules():
        if not isinstance(layer, LoraLayer) or ADAPTER not in layer.lora_A:
            continue
        weight_key = f"{name}.base_layer.weight"
        a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
        weight = state[weight_key]
        delta = b.float() @ a.float()
        if layer.fan_in_fan_out:
            delta = delta.T
        merged[_plain_name(weight_key)] = (weight.float() + delta * layer.scaling[ADAPTER]).to(weight.dtype)
        folded.update((weight_key, f"{name}.lora_A.{ADAPTER}.weight", f"{name}.lora_B.{ADAPTER}.weight"))
    for key, value in state.items():
        if key not in folded:
            if ".lora_" in key:
                raise ValueError(f"merged_state_dict: adapter tensor {key!r} belongs to no LoRA layer of the policy")
            merged[_plain_name(key)] = value
    return merged


def _plain_name(key: str) -> str:
    return key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


class WithoutAdapters:
    """The policy's frozen base for the KL reference: the peft model's forward under ``disable_adapter()``,
    so the reference costs no second copy of the weights. Offers what ``forward.token_logprobs`` uses."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    @property
    def config(self) -> Any:
        return self.policy.config

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.policy.get_output_embeddings()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.policy.disable_adapter():
            return self.policy(*args, **kwargs)


class MergedView:
    """A plain Hugging Face module with the merged weights of a single-rank (unsharded) peft policy.

    Its adapted layers' weights are its own tensors, rewritten in place by :meth:`refresh`; every
    other tensor is the policy's own storage. An ``hf`` engine that shares the trainer's weights in
    process (``engine_setup.shared_engine``) reads this module, so it costs one copy of the adapted
    weights and nothing else.
    """

    def __init__(self, policy: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.policy = policy
        base = policy.get_base_model()
        with torch.device("meta"):
            self.module = AutoModelForCausalLM.from_config(base.config, dtype=base.dtype)
        self.module.generation_config = base.generation_config
        with torch.no_grad():
            for name, tensor in self._merged().items():
                owner_name, _, attr = name.rpartition(".")
                self.module.get_submodule(owner_name)._parameters[attr] = torch.nn.Parameter(
                    tensor.detach(), requires_grad=False)
            for name, buffer in base.named_buffers():
                owner_name, _, attr = name.rpartition(".")
                self.module.get_submodule(owner_name)._buffers[attr] = buffer
        self.module.tie_weights()
        self.module.eval()

    def _merged(self) -> dict[str, torch.Tensor]:
        return merged_state_dict(self.policy, self.policy.state_dict())

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-merge after the adapters changed (an optimizer step, a checkpoint load)."""
        for name, tensor in self._merged().items():
            target = self.module.get_parameter(name)
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor)
