"""``FSDPGRPOConfig``: the ``trainer`` section of a run config for ``fsdp_grpo``."""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from skyrl_core.registry import did_you_mean

from skyrl_trainers.algorithms import ADVANTAGE_ESTIMATORS, LOSS_REDUCTIONS, POLICY_LOSSES

DEPRECATED_STRATEGIES = {"fsdp2": "fsdp"}


class OffPolicyCorrection(BaseModel):
    """Truncated importance sampling on the rollout log-probs (``trainer.off_policy``).

    With ``rho_t = exp(old_logp_t - rollout_logp_t)`` (the trainer's old policy over the policy that
    sampled token t), each token's policy loss is multiplied by a constant (no gradient) weight:
    ``token``: ``min(rho_t, token_cap)``; ``sequence``: ``min(exp(sum_t mask_t log rho_t), sequence_cap)``,
    the same for every token of the sequence. ``none`` treats rollout samples as the old policy's own.
    ``auto`` (the default) is ``token`` wherever the sampler's numbers differ from the trainer's (bf16
    sampling, vLLM, an older policy off sync: :func:`skyrl_trainers.numerics.sampling_mismatch`), else ``none``.
    Sums run over trained tokens (``mask_t = 1``) only; log-ratios are clamped to [-20, 20]; a token the
    engine gave no log-prob for (recorded as 0.0) gets ``rho_t = 1``. Implemented by
    :func:`skyrl_trainers.algorithms.off_policy.tis_weights`; reported as ``train/is_ratio_mean``,
    ``train/is_ratio_max``, ``train/tis_clip_fraction`` (trained tokens whose weight hit the cap) and
    ``train/is_unknown_fraction`` (trained tokens without a rollout log-prob).
    """

    model_config = ConfigDict(extra="forbid")

    tis: Literal["auto", "none", "token", "sequence"] = Field(
        "auto", description="Truncated importance sampling level; auto: token where the sampler's logprobs come "
        "from other numerics than the trainer's (bf16 sampling, vLLM, trainer.mode off sync), else none.")
    token_cap: float = Field(2.0, gt=0, description="Cap of the per-token weight (tis=token).")
    sequence_cap: float = Field(5.0, gt=0, description="Cap of the per-sequence weight (tis=sequence).")


class LoRAConfig(BaseModel):
    """Low-rank adapters on the policy (``trainer.lora``), built with ``peft``; ``rank=0`` trains every weight.

    Each targeted linear layer ``W`` becomes ``W + (alpha / rank) * B @ A`` with trainable ``A``
    (``rank x in``) and ``B`` (``out x rank``, zero at the start), while ``W`` stays frozen. Only ``A`` and
    ``B`` are in the optimizer and in checkpoints; the engines and the export get the merged weights.
    """

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(0, ge=0, description="Adapter rank r; 0 turns LoRA off (full fine-tuning).")
    alpha: float = Field(16.0, gt=0, description="Scale numerator: the adapter's update is multiplied by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input during training.")
    target_modules: str | list[str] = Field(
        "all-linear", description="Layers that get adapters: 'all-linear' (every linear layer but the output head), "
        "a list of module names such as [q_proj, v_proj] (matched as name suffixes), or a regex over full names.")

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names or any(not name.strip() for name in names):
            raise ValueError("give 'all-linear' or at least one non-empty module name")
        return value


class FSDPGRPOConfig(BaseModel):
    """Options of the ``fsdp_grpo`` trainer. Defaults are a short CPU run of the embedded model."""

    model_config = ConfigDict(extra="forbid")

    # model and hardware
    model: str = Field("smollm2-135m", description="Policy: 'tiny-random', 'smollm2-135m', a hub id or a local folder.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Mixed precision of forward/backward (fp32 master weights); auto: bf16 on cuda and on a "
        "CPU with bf16 instructions (AVX512-BF16 or AMX) whose bf16 matmuls ran at least 1.25x the fp32 rate in a "
        "probe at start, else fp32. The hf engine samples in the same precision.")
    strategy: Literal["fsdp"] = Field("fsdp", description="Sharding strategy ('fsdp2' is a deprecated alias).")
    world_size: int = Field(1, ge=1, description="Trainer ranks; 1 runs in-process, more as worker processes.")
    backend: Literal["local", "ray"] = Field("local", description="local processes, or Ray actors in a placement group.")
    ray_address: str | None = Field(None, description="Ray cluster to join (backend=ray); default starts a local one.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    lean_layers: bool = Field(True, description="Llama, Mistral and Qwen gated MLPs and RMSNorms save fewer activations "
                              "and recompute them in backward (elementwise only, same gradients): 0.49 MiB "
                              "less per micro-batch token for smollm2-135m in fp32.")
    # ~1.5 MB of fp32 activations per token for a 30-layer, 576-wide model: 512 keeps a GRPO step of
    # smollm2-135m (weights, grads, AdamW) near 4 GB on CPU; the gradient does not depend on it.
    micro_batch_tokens: int = Field(512, ge=1, description="Token budget (rows x padded length) of one micro-batch; "
                                    "the gradient does not depend on it, peak memory does.")

    lora: LoRAConfig = Field(default_factory=lambda: LoRAConfig(),
                             description="LoRA adapters instead of full fine-tuning (off while rank=0).")

    # optimisation
    steps: int = Field(2, ge=1, description="Training steps (each: one rollout batch, one optimizer step per mini-batch).")
    batch_size: int = Field(1, ge=1, description="Tasks per step; each yields generator.n_samples_per_prompt samples.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per rollout batch (PPO-style; >1 recomputes old logprobs).")
    lr: float = Field(1e-6, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up to lr.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW beta1 and beta2.")
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
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Estimator of the KL to the reference: "
                                                    "k1 log-ratio, k2 squared log-ratio / 2, k3 (ratio - 1) - log-ratio.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    child_advantage: Literal["inherit", "own", "exclude"] = Field(
        "inherit", description="Tree children: root's advantage, their own (grouped per task and depth), or not trained.")
    no_signal_share: float = Field(
        0.9, ge=0, le=1, description="A step whose share of zero-reward-variance groups (advantages all 0) is at "
        "least this has no learning signal (metric train/zero_variance_groups).")
    no_signal_patience: int = Field(
        3, ge=1, description="Warn once when this many steps in a row have no learning signal "
        "(metric train/no_signal_steps: the current streak).")

    # asynchronous training (docs/packages/trainers.md: "Asynchronous training")
    mode: Literal["sync", "one_step_off", "async"] = Field(
        "sync", description="sync: generate a batch, then train on it; one_step_off: generate step N+1's batch "
        "while step N trains; async: generation never stops and finished groups are trained as they arrive.")
    generation_workers: int | None = Field(
        None, ge=1, description="async: task groups generated concurrently (default: 2 x batch_size).")
    max_staleness: int = Field(1, ge=0, description="async: most policy versions a trained group may lag the trainer.")
    stale_groups: Literal["drop", "keep"] = Field(
        "drop", description="async: a group that arrives staler than max_staleness is dropped (counted) or kept.")
    engine_placement: Literal["in_process", "process", "ray"] = Field(
        "in_process", description="Where the rollout engine runs: in the driver process (sharing the policy's "
        "weights when it can), in a child process, or as a Ray actor; weights reach it through update_weights.")
    off_policy: OffPolicyCorrection = Field(
        default_factory=lambda: OffPolicyCorrection(),
        description="Correction for samples the trainer's old policy did not generate (needed off sync).")

    # data
    train_files: list[str] = Field(default_factory=list, description="JSONL/Parquet task files; default: the env's dataset.")
    data_split: str = Field("train", description="Split of the env's built-in dataset.")
    shuffle: bool = Field(True, description="Reshuffle tasks every epoch (seeded by run.seed).")

    # held-out evaluation (docs/packages/trainers.md: "Held-out evaluation")
    eval_samples: int = Field(
        8, ge=0, description="Held-out tasks evaluated before the first step, every eval_every steps and after the "
        "last (one episode each; the same tasks and seeds every time), spread evenly over the split; 0: no evaluation.")
    eval_every: int = Field(0, ge=0, description="Also evaluate after every N-th step; 0: only before the first "
                            "step and after the last.")
    eval_split: str | None = Field(
        None, description="Built-in split to evaluate on; default: the one the env declares held out for data_split "
        "(EnvSpec.eval_splits; 'test' for 'train' unless the env says otherwise).")
    eval_files: list[str] = Field(default_factory=list, description="JSONL/Parquet task files to evaluate on "
                                  "instead of a built-in split.")
    eval_temperature: float | None = Field(None, ge=0, description="Sampling temperature of evaluation episodes; "
                                           "default: generator.temperature; 0: greedy.")

    # outputs
    checkpoint_every: int = Field(0, ge=0, description="Checkpoint every N steps (0: only at the end).")
    export: bool = Field(True, description="Save the final policy as a Hugging Face folder (run_dir/export).")
    samples_per_step: int = Field(4, ge=0, description="Root episodes per step written to samples.jsonl, each with its child episodes.")

    @model_validator(mode="after")
    def _off_sync_needs_correction(self) -> FSDPGRPOConfig:
        if self.mode != "sync" and self.off_policy.tis == "none":
            raise ValueError(
                f"trainer.mode={self.mode} trains on samples generated by an older policy than the one being "
                "updated, but with trainer.off_policy.tis=none the loss treats them as the trainer's own samples "
                "(PPO's ratio starts at 1), so the update is biased; set trainer.off_policy.tis=token (or sequence)")
        return self

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
