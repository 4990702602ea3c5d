"""``FSDPGRPOConfig``: the ``trainer`` section of a run config for ``fsdp_grpo``."""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from skyrl_core.registry import did_you_mean

from skyrl_trainers.algorithms import ADVANTAGE_ESTIMATORS, LOSS_REDUCTIONS, POLICY_LOSSES

DEPRECATED_STRATEGIES = {"fsdp2": "fsdp"}


class FSDPGRPOConfig(BaseModel):
    """Options of the ``fsdp_grpo`` trainer. Defaults are a short CPU run of the embedded model."""

    model_config = ConfigDict(extra="forbid")

    # model and hardware
    model: str = Field("smollm2-135m", description="Policy: 'tiny-random', 'smollm2-135m', a hub id or a local folder.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Mixed precision of forward/backward; auto: bf16 on cuda, fp32 on cpu.")
    strategy: Literal["fsdp"] = Field("fsdp", description="Sharding strategy ('fsdp2' is a deprecated alias).")
    world_size: int = Field(1, ge=1, description="Trainer ranks; 1 runs in-process, more as worker processes.")
    backend: Literal["local", "ray"] = Field("local", description="local processes, or Ray actors in a placement group.")
    ray_address: str | None = Field(None, description="Ray cluster to join (backend=ray); default starts a local one.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    # ~1.5 MB of fp32 activations per token for a 30-layer, 576-wide model: 512 keeps a GRPO step of
    # smollm2-135m (weights, grads, AdamW) near 4 GB on CPU; the gradient does not depend on it.
    micro_batch_tokens: int = Field(512, ge=1, description="Token budget (rows x padded length) of one micro-batch; "
                                    "the gradient does not depend on it, peak memory does.")

    # optimisation
    steps: int = Field(2, ge=1, description="Training steps (each: one rollout batch, one optimizer step per mini-batch).")
    batch_size: int = Field(1, ge=1, description="Tasks per step; each yields generator.n_samples_per_prompt samples.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per rollout batch (PPO-style; >1 recomputes old logprobs).")
    lr: float = Field(1e-6, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up to lr.")
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")

    # algorithm
    advantage: str = Field("grpo", description=f"Advantage estimator: {', '.join(ADVANTAGE_ESTIMATORS)}.")
    grpo_norm_by_std: bool = Field(True, description="GRPO: divide by the group std (False: Dr. GRPO).")
    policy_loss: str = Field("ppo_clip", description=f"Policy loss: {', '.join(POLICY_LOSSES)}.")
    clip_eps_low: float | None = Field(None, ge=0, description="Lower clip epsilon; default: the loss's own.")
    clip_eps_high: float | None = Field(None, ge=0, description="Upper clip epsilon; default: the loss's own.")
    dual_clip_c: float = Field(3.0, gt=1, description="dual_clip: bound on the loss of negative advantages.")
    loss_reduction: str = Field("token_mean", description=f"Loss reduction: {', '.join(LOSS_REDUCTIONS)}.")
    loss_norm: float = Field(1.0, gt=0, description="sequence_mean_token_sum: constant divisor (e.g. max length).")
    kl_coef: float = Field(0.0, ge=0, description="KL loss to a frozen reference model; 0 loads no reference.")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    child_advantage: Literal["inherit", "own", "exclude"] = Field(
        "inherit", description="Tree children: root's advantage, their own (grouped per task and depth), or not trained.")

    # data
    train_files: list[str] = Field(default_factory=list, description="JSONL/Parquet task files; default: the env's dataset.")
    data_split: str = Field("train", description="Split of the env's built-in dataset.")
    shuffle: bool = Field(True, description="Reshuffle tasks every epoch (seeded by run.seed).")

    # outputs
    checkpoint_every: int = Field(0, ge=0, description="Checkpoint every N steps (0: only at the end).")
    export: bool = Field(True, description="Save the final policy as a Hugging Face folder (run_dir/export).")
    samples_per_step: int = Field(4, ge=0, description="Trajectories per step written to samples.jsonl.")

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy_alias(cls, value: object) -> object:
        if value in DEPRECATED_STRATEGIES:
            new = DEPRECATED_STRATEGIES[value]
            warnings.warn(f"trainer.strategy={value!r} is deprecated; use {new!r}", FutureWarning, stacklevel=2)
            return new
        return value

    @field_validator("advantage", "policy_loss", "loss_reduction")
    @classmethod
    def _known_algorithm(cls, value: str, info: ValidationInfo) -> str:
        choices = list(_ALGORITHM_CHOICES[info.field_name])
        if value not in choices:
            raise ValueError(f"unknown {info.field_name} {value!r}.{did_you_mean(value, choices)} "
                             f"Choose from {', '.join(choices)}")
        return value


_ALGORITHM_CHOICES = {"advantage": ADVANTAGE_ESTIMATORS, "policy_loss": POLICY_LOSSES,
                      "loss_reduction": LOSS_REDUCTIONS}
