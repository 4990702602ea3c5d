"""One trainer rank: an FSDP2-sharded policy (plain with one rank), its optimizer and scheduler, checkpoints and export.

The same class runs in-process (world size 1), in a spawned worker process, or inside a Ray actor;
only the transport around it differs (see :mod:`skyrl_trainers.workers`).

With ``trainer.lora.rank > 0`` the policy is a ``peft`` model (:mod:`skyrl_trainers.lora`): the base is
sharded like any policy but frozen, only the adapters are in the optimizer and the checkpoints, and
everything that leaves the rank (engine weights, the export) is the merged plain model.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from skyrl_core.factory import ConfigError

from skyrl_trainers.batching import MiniBatchPlan, TrainSample
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.forward import PACKABLE_ATTENTION, MicroBatch, collate, token_logprobs
from skyrl_trainers.lean_layers import install_lean_layers
from skyrl_trainers.lora import MergedView, WithoutAdapters, apply_lora, is_lora, merged_state_dict
from skyrl_trainers.objective import Normalisers, carried_states, micro_batch_loss
from skyrl_trainers.precision import resolve_precision
from skyrl_trainers.prompt_cache import PromptCache
from skyrl_trainers.rng import rng_state, set_rng_state
from skyrl_trainers.run_folder import LORA_ADAPTER_FOLDER


@dataclass
class WorkerSpec:
    """Everything a rank needs to build itself; picklable so it can cross process boundaries."""

    config: FSDPGRPOConfig
    temperature: float = 1.0
    seed: int = 0
    timeout_s: float = 600.0


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu")
    return requested


class TrainWorker:
    """Rank ``rank`` of ``world_size``; joins the process group at ``master_addr:master_port``."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, spec: WorkerSpec) -> None:
        self.rank, self.world_size, self.spec = rank, world_size, spec
        cfg = self.cfg = spec.config
        kind = resolve_device(cfg.device)
        if kind == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        self.device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")
        dist.init_process_group("cpu:gloo,cuda:nccl" if kind == "cuda" else "gloo",
                                init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=spec.timeout_s))
        try:
            self._build(kind)
        except BaseException:
            self.close()  # a rank that failed to build must not keep the process group (an in-process retry)
            raise

    def _build(self, kind: str) -> None:
        """Policy (sharded, with LoRA adapters if configured), reference model, optimizer and scheduler."""
        from skyrl_trainers.models import load_model_and_tokenizer

        cfg, spec, rank = self.cfg, self.spec, self.rank
        torch.manual_seed(spec.seed + rank)
        random.seed(spec.seed + rank)
        model, self.tokenizer = load_model_and_tokenizer(cfg.model, dtype=torch.float32, device=str(self.device))
        self.hf_config = model.config
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # shared-prompt rows need an attention that takes a custom mask (see skyrl_trainers.forward)
        attention = getattr(model.config, "_attn_implementation", None)
        self.pack = attention in PACKABLE_ATTENTION
        # a prompt runs once per mini-batch (skyrl_trainers.prompt_cache): block attention, unsharded weights
        self.carry_prompts = attention == "sdpa" and self.world_size == 1
        self.bf16 = resolve_precision(cfg.precision, kind).bf16
        if cfg.lean_layers:
            install_lean_layers(model)
        if cfg.gradient_checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        self.lora = cfg.lora.rank > 0
        # the module being trained: the plain model, or a peft model around it
        self.policy = apply_lora(model, cfg.lora) if self.lora else model
        self.policy.train()
        self._shard(self.policy)
        self._merged_view: MergedView | None = None
        self.ref_model: Any = None
        if cfg.kl_coef > 0 and self.lora:  # the frozen base is the reference
            self.ref_model = WithoutAdapters(self.policy)
        elif cfg.kl_coef > 0:
            self.ref_model, _ = load_model_and_tokenizer(cfg.model, dtype=torch.float32, device=str(self.device))
            self.ref_model.requires_grad_(False)
            self._shard(self.ref_model)
        self.trainable = [p for p in self.policy.parameters() if p.requires_grad]
        if self.world_size == 1:  # gradients are views of one zeroed buffer there (see _zero_gradients)
            sparse_embedding_gradient(self.policy)
        # CPU: one fused kernel per tensor, 2.5x faster than torch's default loop there (SmolLM2-135M: 0.16 s
        # a step against 0.40) and without its temporaries; FSDP's sharded parameters keep the default
        fused = self.device.type == "cpu" and self.world_size == 1
        self.optimizer = torch.optim.AdamW(self.trainable, lr=cfg.lr, betas=cfg.adam_betas,
                                           weight_decay=cfg.weight_decay, fused=fused or None)
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)

    def _shard(self, model: torch.nn.Module) -> None:
        """``fully_shard`` each decoder layer, then the root; every rank starts from rank 0's weights.

        A single rank keeps the plain module: FSDP2 over one rank shards nothing, yet gathers every
        layer's weights into fresh buffers on each forward and backward of each micro-batch and
        reduce-scatters each gradient (a GRPO step of SmolLM2-135M on CPU: 25 s with it, 19 s
        without, same gradients). Checkpoints (torch.distributed.checkpoint) load across both layouts.
        bf16 still comes from autocast (see ``_forward``); FSDP's mixed-precision policy applies to 2+ ranks.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if self.world_size == 1:
            return
        full = {k: v.clone() for k, v in model.state_dict().items()} if self.rank == 0 else {}
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if self.bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        hf_model = model.get_base_model() if is_lora(model) else model
        layer_classes = tuple(getattr(hf_model, "_no_split_modules", None) or ())
        for module in model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    @property
    def model(self) -> torch.nn.Module:
        """The policy as a plain Hugging Face module whose tensors are this rank's own, for an engine that
        generates with them in place (``engine_setup.shared_engine``, one unsharded rank only): the trained
        module itself, or with LoRA a :class:`~skyrl_trainers.lora.MergedView` kept current after each update."""
        if not self.lora:
            return self.policy
        if self._merged_view is None:
            if self.world_size > 1:
                raise RuntimeError("a LoRA policy sharded over several ranks has no in-place merged model; "
                                   "take its weights with full_state_dict()")
            self._merged_view = MergedView(self.policy)
        return self._merged_view.module

    # -- training ---------------------------------------------------------------------------------

    def carries_prompts(self) -> bool:
        """Whether micro-batch rows leave their prompts out (the planner then counts one prompt token a row)."""
        return self.carry_prompts

    def train_step(self, plans: list[MiniBatchPlan]) -> dict[str, float]:
        """One optimizer step per mini-batch plan; returns sums that the driver adds over ranks."""
        totals: dict[str, float] = {}
        old = self._old_logprobs(plans) if len(plans) > 1 else None
        for k, plan in enumerate(plans):
            self._zero_gradients()
            prompts = PromptCache(self.device)
            # autocast keeps its bf16 copy of each weight until its outermost context ends, so the weights
            # are cast once per mini-batch rather than once per micro-batch; they change only after it
            with self._autocast():
                for m, samples in enumerate(plan.micro_batches):
                    accumulate(totals, self._backward(self._collate(samples), plan, old[k][m] if old else None, prompts))
                prompts.backward(self.policy)
            torch.clear_autocast_cache()  # stale after this step, even where a caller's own autocast is open
            accumulate(totals, self._optimizer_step())
        # the gradients are dead until the next step: free them for the rollout in between
        self.optimizer.zero_grad(set_to_none=True)
        self._refresh_merged_view()
        return totals

    def _zero_gradients(self) -> None:
        """Zero gradients; on one unsharded rank, as views of one buffer allocated at once.

        Gradients otherwise appear one by one during the first micro-batch's backward, between that
        micro-batch's activations, and pin glibc's heap in pieces. One buffer is one ``mmap`` of its own
        outside the heap, returned to the system whole when the step frees it.
        """
        self.optimizer.zero_grad(set_to_none=True)
        if self.world_size > 1:
            return
        for dtype in {p.dtype for p in self.trainable}:
            params = [p for p in self.trainable if p.dtype == dtype]
            flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=self.device)
            for p, grad in zip(params, flat.split([p.numel() for p in params]), strict=True):
                p.grad = grad.view_as(p)

    def _refresh_merged_view(self) -> None:
        if self._merged_view is not None:
            self._merged_view.refresh()

    @torch.no_grad()
    def _old_logprobs(self, plans: list[MiniBatchPlan]) -> list[list[torch.Tensor]]:
        """Log-probs under the weights before this step's first update (needed when it has several)."""
        out = []
        for plan in plans:
            prompts = PromptCache(self.device)
            out.append([self._forward(self.policy, self._collate(samples), prompts) for samples in plan.micro_batches])
        return out

    def _collate(self, samples: list[TrainSample]) -> MicroBatch:
        return collate(samples, self.pad_id, pack=self.pack, carry_prompts=self.carry_prompts).to(self.device)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _forward(self, model: torch.nn.Module, batch: MicroBatch, prompts: PromptCache) -> torch.Tensor:
        with self._autocast():
            return token_logprobs(model, batch, temperature=self.spec.temperature, trained_only=True,
                                  carried=carried_states(prompts, model, batch))[0]

    def _backward(self, batch: MicroBatch, plan: MiniBatchPlan, old_logp: torch.Tensor | None,
                  prompts: PromptCache) -> dict[str, float]:
        with self._autocast():
            loss, metrics = micro_batch_loss(self.cfg, self.policy, batch,
                                             Normalisers(plan.batch_tokens, plan.batch_sequences),
                                             old_logp=old_logp, ref_model=self.ref_model,
                                             temperature=self.spec.temperature, prompts=prompts)
        # FSDP averages gradients over ranks; the micro-batch shares already sum to the batch loss. Backward
        # runs without autocast, as outside the mini-batch's context (which stays open for its cached casts).
        with torch.autocast(self.device.type, enabled=False):
            (loss * self.world_size).backward()
        return metrics

    def _optimizer_step(self) -> dict[str, float]:
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.cfg.max_grad_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        grad_norm = float(norm)
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            self.optimizer.step()
            skipped = 0.0
        else:  # a non-finite gradient would corrupt the weights; drop this update
            self.optimizer.zero_grad(set_to_none=True)
            skipped = 1.0
        self.scheduler.step()
        return {"grad_norm_sum": grad_norm, "optimizer_steps": 1.0, "skipped_steps": skipped, "lr_sum": lr}

    # -- weights out --------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The unsharded weights on CPU at rank 0 (``None`` elsewhere) under the plain Hugging Face names,
        adapters merged in; a collective call."""
        state = self._gathered_policy_state()
        if state is None or not self.lora:
            return state
        return merged_state_dict(self.policy, state)

    def _gathered_policy_state(self) -> dict[str, torch.Tensor] | None:
        """The trained module's own full state dict (peft's names under LoRA) at rank 0; a collective call."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else None

    def export(self, folder: str) -> None:
        """Write a Hugging Face folder (safetensors, config, tokenizer) that ``from_pretrained`` loads: the
        policy, with LoRA merged in, plus (LoRA) the adapter alone in ``folder/lora_adapter`` in peft's
        ``save_pretrained`` format."""
        from transformers import AutoModelForCausalLM

        state = self._gathered_policy_state()
        if self.rank != 0:
            return
        model = AutoModelForCausalLM.from_config(self.hf_config, dtype=torch.float32)
        model.load_state_dict(merged_state_dict(self.policy, state) if self.lora else state, strict=True)
        generation_config = getattr(self.policy, "generation_config", None)
        if generation_config is not None:
            model.generation_config = generation_config
        model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        if self.lora:
            self.policy.save_pretrained(str(Path(folder) / LORA_ADAPTER_FOLDER), state_dict=state)

    # -- checkpoints --------------------------------------------------------------------------------

    def save_checkpoint(self, folder: str) -> None:
        """Sharded model and optimizer (torch.distributed.checkpoint) plus this rank's scheduler and RNG.

        With LoRA the model part holds the adapters only: the frozen base is reloaded from ``trainer.model``."""
        import torch.distributed.checkpoint as dcp

        model_state, optim_state = self._checkpoint_state()
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(Path(folder) / "shards"))
        torch.save({"scheduler": self.scheduler.state_dict(), "rng": rng_state(), "lora": self._lora_shape()},
                   Path(folder) / f"worker_rank{self.rank}.pt")

    def load_checkpoint(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        extra_path = Path(folder) / f"worker_rank{self.rank}.pt"
        if not extra_path.exists():
            extra_path = Path(folder) / "worker_rank0.pt"  # resumed with more ranks than were saved
        extra = torch.load(extra_path, weights_only=False)
        saved = extra.get("lora", {"rank": 0})  # checkpoints from before LoRA trained every weight
        if saved != self._lora_shape():
            raise ConfigError(f"checkpoint {folder} was trained with trainer.lora {_describe_lora(saved)}, "
                              f"but this run has {_describe_lora(self._lora_shape())}; resume with the same "
                              "trainer.lora.rank, alpha and target_modules")
        model_state, optim_state = self._checkpoint_state()
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(Path(folder) / "shards"))
        # dcp.load insists on every key asked for; non-strict only excuses the frozen base (LoRA)
        set_state_dict(self.policy, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=not self.lora))
        self._refresh_merged_view()
        self.scheduler.load_state_dict(extra["scheduler"])
        set_rng_state(extra["rng"])

    def _lora_shape(self) -> dict[str, Any]:
        """What a checkpoint's model part depends on: the adapters' shapes and scale (dropout does not matter)."""
        lora = self.cfg.lora
        return {"rank": lora.rank, "alpha": lora.alpha, "target_modules": lora.target_modules} if self.lora else {"rank": 0}

    def _checkpoint_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Model and optimizer state to checkpoint: every parameter, or (LoRA) the trainable ones only.

        Filtered by name rather than with ``ignore_frozen_params``, which keeps a frozen weight tied to
        another (the output head of tiny-random or SmolLM2: a vocabulary-sized matrix)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.policy, self.optimizer)
        if self.lora:
            trainable = {name for name, p in self.policy.named_parameters(remove_duplicate=False) if p.requires_grad}
            model_state = {k: v for k, v in model_state.items() if k in trainable}
        return model_state, optim_state

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _describe_lora(shape: dict[str, Any]) -> str:
    if not shape["rank"]:
        return "off (full fine-tuning)"
    return ", ".join(f"{key}={value!r}" for key, value in shape.items())


def accumulate(totals: dict[str, float], values: dict[str, float]) -> None:
    """Add metric sums into ``totals`` (keys ending in ``_max`` keep the maximum)."""
    for key, value in values.items():
        if key.endswith("_max"):
            totals[key] = max(totals.get(key, value), value)
        else:
            totals[key] = totals.get(key, 0.0) + value


def worker_threads(world_size: int) -> int:
    """CPU threads per rank so that ranks on one machine do not oversubscribe its cores."""
    return max(1, (os.cpu_count() or 1) // world_size)


def sparse_embedding_gradient(model: torch.nn.Module) -> bool:
    """Make a trainable input embedding's backward yield only the rows of the tokens looked up.

    Its dense backward builds a zeroed vocabulary-sized tensor each micro-batch (113 MB for SmolLM2,
    in fresh pages each time), scatters the rows into it and adds all of it to the gradient; a sparse one
    is added to the existing dense gradient in place, row by row. Only where every gradient already
    exists before backward (one unsharded rank), so it never becomes a sparse ``.grad`` itself.
    """
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if type(embedding) is not torch.nn.Embedding or not embedding.weight.requires_grad:
        return False
    embedding.sparse = True
    return True
