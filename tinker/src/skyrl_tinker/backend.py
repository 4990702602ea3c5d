"""One base model, many LoRA adapters: forward/backward, optimizer steps and adapter state.

Multi-tenancy: every training client is a *named adapter* of one ``peft.PeftModel`` that wraps the
single copy of the base weights. peft keeps each adapter's ``lora_A``/``lora_B`` in their own
parameters and ``set_adapter`` routes the forward through one adapter only (and marks only its
parameters trainable), so a backward for client A can never write into client B's gradients, and
accumulated gradients simply stay on an adapter's parameters until its own ``optim_step``. Each
adapter has its own AdamW. The alternative, one ``PeftModel`` per client over a shared base module,
would make peft wrap the same ``nn.Linear`` objects twice; named adapters are the use peft supports.

Not thread-safe: the server calls it from one worker thread (see :mod:`skyrl_tinker.futures`).
Adapters are never applied to the output head (``train_unembed`` is ignored): on models with tied
embeddings a LoRA delta on the head would also move the input embeddings.

A ``forward_backward`` that fails part-way (out of memory, a bad row that got past validation)
leaves the backend as it was: the routing hooks come off the layers and the gradients of the
adapters involved are put back as they were before the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from skyrl_core.http_hygiene import shown
from skyrl_trainers.forward import MicroBatch, token_logprobs
from skyrl_trainers.models import load_model_and_tokenizer, model_source

from skyrl_tinker.losses import LossInputError, check_datum, elementwise_loss, loss_batch, resolve_config
from skyrl_tinker.wire import DatumIn

LORA_ALPHA = 32  # Tinker exposes only the rank; scaling is alpha / rank
_PLACEHOLDER = "placeholder"  # keeps the PeftModel alive when no client has an adapter
# Tinker's AdamParams and their defaults
ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                 "grad_clip_norm": 0.0}


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "seed": self.seed, "train_attn": self.train_attn, "train_mlp": self.train_mlp}


@dataclass
class _Adapter:
    name: str
    spec: AdapterSpec
    optimizer: torch.optim.Optimizer
    steps: int = 0
    pending_grads: bool = False


@dataclass
class ForwardResult:
    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float] = field(default_factory=dict)


class Backend:
    """The base model wrapped for LoRA, and each client's adapter and optimizer."""

    def __init__(self, base_model: str, *, device: str = "cpu", max_batch_datums: int = 1024,
                 micro_batch_tokens: int = 8192) -> None:
        model, _ = load_model_and_tokenizer(base_model, device=device)
        self.base_model_name = base_model
        self.tokenizer_source = model_source(base_model)
        self.device = torch.device(device)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.max_batch_datums = max_batch_datums
        self.micro_batch_tokens = micro_batch_tokens
        self.arch = getattr(model.config, "model_type", None)
        for p in model.parameters():
            p.requires_grad_(False)
        head = model.get_output_embeddings()
        # base weights of every adapter-able linear (shared, never modified: LoRA leaves the base frozen)
        self.base_linear_weights: dict[str, torch.Tensor] = {
            f"{name}.weight": module.weight for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head}
        self._attn_names = sorted({n.rsplit(".", 2)[-2] for n in self.base_linear_weights if "attn" in n})
        self._mlp_names = sorted({n.rsplit(".", 2)[-2] for n in self.base_linear_weights if "mlp" in n})
        self.peft = get_peft_model(model, self._lora_config(AdapterSpec(rank=1)), adapter_name=_PLACEHOLDER)
        self.peft.eval()
        self._adapters: dict[str, _Adapter] = {}
        self._counter = 0

    # --- adapters --------------------------------------------------------------------------------

    def _lora_config(self, spec: AdapterSpec) -> LoraConfig:
        targets = (self._attn_names if spec.train_attn else []) + (self._mlp_names if spec.train_mlp else [])
        if not targets:
            raise LossInputError("the LoRA config trains nothing: set train_attn or train_mlp")
        return LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets)

    def has(self, model_id: str) -> bool:
        return model_id in self._adapters

    def create(self, model_id: str, spec: AdapterSpec) -> None:
        """A fresh adapter (``lora_B = 0``, so it starts as the base model) and its AdamW."""
        if spec.rank < 1:
            raise LossInputError(f"LoRA rank must be >= 1, got {spec.rank} (full fine-tuning is not supported)")
        if model_id in self._adapters:
            raise LossInputError(f"model {shown(model_id)} already exists")
        self._counter += 1
        name = f"adapter{self._counter}"
        with torch.random.fork_rng(devices=[]):
            if spec.seed is not None:
                torch.manual_seed(spec.seed)
            self.peft.add_adapter(name, self._lora_config(spec))
        params = self._params(name)
        optimizer = torch.optim.AdamW(params, lr=ADAM_DEFAULTS["learning_rate"],
                                      betas=(ADAM_DEFAULTS["beta1"], ADAM_DEFAULTS["beta2"]),
                                      eps=ADAM_DEFAULTS["eps"], weight_decay=ADAM_DEFAULTS["weight_decay"])
        self._adapters[model_id] = _Adapter(name, spec, optimizer)

    def drop(self, model_id: str) -> None:
        adapter = self._adapters.pop(model_id, None)
        if adapter is not None:
            self.peft.set_adapter(_PLACEHOLDER)  # peft warns when the active adapter is deleted
            self.peft.delete_adapter(adapter.name)

    def _params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if f".{name}." in n]

    def _activate(self, model_id: str) -> _Adapter:
        adapter = self._adapters.get(model_id)
        if adapter is None:
            raise KeyError(model_id)
        self.peft.set_adapter(adapter.name)
        return adapter

    # --- validation ------------------------------------------------------------------------------

    def check_batch(self, data: Sequence[DatumIn], loss_fn: str, config: Mapping[str, float | str] | None
                    ) -> dict[str, float]:
        """Raise :class:`LossInputError` for anything Tinker would refuse; returns the resolved config."""
        resolved = resolve_config(loss_fn, config)
        if not data:
            raise LossInputError("forward_backward got no data")
        if len(data) > self.max_batch_datums:
            raise LossInputError(f"batch has {len(data)} datums, the server accepts at most {self.max_batch_datums} "
                                 "per request (--max-batch-datums)")
        for i, datum in enumerate(data):
            if self.max_context is not None and len(datum.tokens) > self.max_context:
                raise LossInputError(f"datum {i}: {len(datum.tokens)} tokens, the model's context is {self.max_context}")
            check_datum(loss_fn, i, datum.tokens, datum.loss_fn_inputs, self.vocab_size)
        return resolved

    # --- training --------------------------------------------------------------------------------

    def forward_backward(self, model_id: str, data: Sequence[DatumIn], loss_fn: str,
                         config: Mapping[str, float | str] | None, *, forward_only: bool = False) -> ForwardResult:
        """Per-datum ``logprobs`` and ``elementwise_loss``; gradients of the summed loss are added to the
        adapter's ``.grad`` (kept until :meth:`optim_step`) unless ``forward_only``."""
        return self.forward_backward_many([(model_id, data)], loss_fn, config, forward_only=forward_only)[0]

    def forward_backward_many(self, requests: Sequence[tuple[str, Sequence[DatumIn]]], loss_fn: str,
                              config: Mapping[str, float | str] | None, *, forward_only: bool = False
                              ) -> list[ForwardResult]:
        """Several models' requests (same loss) in shared forward/backward passes.

        With more than one adapter, every row goes through its own model's adapter only (peft's
        mixed-adapter batch, ``adapter_names``): the batch loss is a sum of per-row losses, so each
        adapter's gradient is exactly what its own request alone would give. If it raises, the
        adapters' gradients are what they were before the call.
        """
        resolved = {}
        for _, data in requests:
            resolved = self.check_batch(data, loss_fn, config)
        adapters = [self._adapters.get(model_id) for model_id, _ in requests]
        missing = [model_id for (model_id, _), a in zip(requests, adapters, strict=True) if a is None]
        if missing:
            raise KeyError(missing[0])
        self.peft.set_adapter(adapters[0].name)
        routed = len({a.name for a in adapters}) > 1
        params = [p for adapter in adapters for group in adapter.optimizer.param_groups for p in group["params"]]
        if routed and not forward_only:  # set_adapter leaves only the first adapter trainable
            for p in params:
                p.requires_grad_(True)
        saved = {} if forward_only else {p: None if p.grad is None else p.grad.clone() for p in params}
        try:
            outputs, totals = self._run_rows(adapters, requests, loss_fn, resolved, routed, forward_only)
        except BaseException:
            for p, grad in saved.items():
                p.grad = grad
            raise
        if not forward_only:
            for adapter in adapters:
                adapter.pending_grads = True
        return [ForwardResult(out, {"loss:sum": total}) for out, total in zip(outputs, totals, strict=True)]

    def _run_rows(self, adapters: list[_Adapter], requests: Sequence[tuple[str, Sequence[DatumIn]]], loss_fn: str,
                  config: Mapping[str, float], routed: bool, forward_only: bool
                  ) -> tuple[list[list[dict[str, np.ndarray]]], list[float]]:
        rows = [(i, adapter.name, datum) for i, (adapter, (_, data)) in enumerate(zip(adapters, requests, strict=True))
                for datum in data]
        outputs: list[list[dict[str, np.ndarray]]] = [[] for _ in requests]
        totals = [0.0] * len(requests)
        for chunk in self._micro_batches(rows):
            data = [datum for _, _, datum in chunk]
            with torch.set_grad_enabled(not forward_only):
                names = [name for _, name, _ in chunk] if routed else None
                logp, per_token = self._loss(data, loss_fn, config, names)
                if not forward_only:
                    per_token.sum().backward()
            for (owner, _, datum), lp, loss in zip(chunk, logp.detach().float().cpu(),
                                                   per_token.detach().float().cpu(), strict=True):
                n = len(datum.tokens)
                outputs[owner].append({"logprobs": lp[:n].numpy(), "elementwise_loss": loss[:n].numpy()})
                totals[owner] += float(loss[:n].sum())
        return outputs, totals

    def _micro_batches(self, rows: Sequence[tuple[int, str, DatumIn]]) -> list[list[tuple[int, str, DatumIn]]]:
        chunks: list[list[tuple[int, str, DatumIn]]] = [[]]
        width = 0
        for row in rows:
            width = max(width, len(row[2].tokens))
            if chunks[-1] and width * (len(chunks[-1]) + 1) > self.micro_batch_tokens:
                chunks.append([])
                width = len(row[2].tokens)
            chunks[-1].append(row)
        return chunks

    def _loss(self, chunk: Sequence[DatumIn], loss_fn: str, config: Mapping[str, float],
              adapter_names: list[str] | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.micro_batch(chunk)
        losses = loss_batch([d.loss_fn_inputs for d in chunk], batch.targets.shape[1]).to(self.device)
        with self._routed(adapter_names):
            logp, _ = token_logprobs(self.peft, batch)
        return logp, elementwise_loss(loss_fn, logp, losses, config)

    @contextlib.contextmanager
    def _routed(self, adapter_names: list[str] | None) -> Iterator[None]:
        """Route row ``i`` of the forwards inside through adapter ``adapter_names[i]`` (peft's mixed-adapter
        batch). peft's own ``adapter_names`` argument leaves its hooks on the layers when the forward
        raises (no ``finally``), and every later forward would then be routed by this batch's names."""
        if adapter_names is None:
            yield
            return
        hooks = [layer.register_forward_pre_hook(partial(_route_rows, adapter_names), with_kwargs=True)
                 for layer in self.peft.modules() if isinstance(layer, LoraLayer)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def micro_batch(self, chunk: Sequence[DatumIn]) -> MicroBatch:
        """One datum per right-padded row; position ``t`` of a row predicts ``target_tokens[t]``."""
        n, width = len(chunk), max(len(d.tokens) for d in chunk)
        ids = torch.zeros(n, width, dtype=torch.long)
        mask = torch.zeros(n, width, dtype=torch.long)
        targets = torch.zeros(n, width, dtype=torch.long)
        for i, datum in enumerate(chunk):
            k = len(datum.tokens)
            ids[i, :k] = torch.tensor(datum.tokens)
            mask[i, :k] = 1
            targets[i, :k] = torch.as_tensor(datum.loss_fn_inputs["target_tokens"].astype(np.int64))
        positions = torch.arange(width).expand(n, width).contiguous()
        predictors = torch.arange(n * width).view(n, width)
        zeros = torch.zeros(n, width)
        return MicroBatch(ids, positions, mask, predictors, targets, mask.float(), zeros, zeros).to(self.device)

    def optim_step(self, model_id: str, params: Mapping[str, float]) -> dict[str, float]:
        """One AdamW step on the adapter's accumulated gradients (then cleared), with Tinker's AdamParams
        (``ADAM_DEFAULTS`` for those not given; the caller checks their values)."""
        adapter = self._activate(model_id)
        params = {**ADAM_DEFAULTS, **params}
        lr = float(params["learning_rate"])
        for group in adapter.optimizer.param_groups:
            group.update(lr=lr, betas=(float(params["beta1"]), float(params["beta2"])), eps=float(params["eps"]),
                         weight_decay=float(params["weight_decay"]))
        trainable = [p for group in adapter.optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in trainable if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        clip = float(params["grad_clip_norm"])
        if clip > 0 and grads:
            torch.nn.utils.clip_grad_norm_(trainable, clip)
        adapter.optimizer.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        adapter.steps += 1
        adapter.pending_grads = False
        return {"grad_norm:mean": norm, "learning_rate:mean": lr, "step:max": float(adapter.steps)}

    # --- state -----------------------------------------------------------------------------------

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        """The adapter's weights (peft's saved-adapter naming), copied to CPU."""
        adapter = self._adapters[model_id]
        state = get_peft_model_state_dict(self.peft, adapter_name=adapter.name)
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}

    def gradients(self, model_id: str) -> dict[str, torch.Tensor]:
        """The adapter's accumulated gradients (peft's saved-adapter naming), copied to CPU; for checks."""
        name = self._adapters[model_id].name
        return {n.replace(f".{name}.", "."): p.grad.detach().to("cpu", copy=True)
                for n, p in self.peft.named_parameters() if f".{name}." in n and p.grad is not None}

    def optimizer_state(self, model_id: str) -> dict[str, Any]:
        adapter = self._adapters[model_id]
        return {"optimizer": adapter.optimizer.state_dict(), "steps": adapter.steps}

    def load_state(self, model_id: str, weights: Mapping[str, torch.Tensor],
                   optimizer: Mapping[str, Any] | None = None) -> None:
        """Overwrite an existing adapter's weights (and optimizer state when given)."""
        adapter = self._adapters[model_id]
        result = set_peft_model_state_dict(self.peft, dict(weights), adapter_name=adapter.name)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise LossInputError(f"checkpoint does not fit this adapter: unexpected keys {unexpected[:3]}")
        for p in self._params(adapter.name):
            p.grad = None
        if optimizer is not None:
            adapter.optimizer.load_state_dict(optimizer["optimizer"])
            adapter.steps = int(optimizer.get("steps", 0))


def _route_rows(adapter_names: list[str], module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A LoRA layer's forward pre-hook: its rows go through the adapters named (peft's mixed batch)."""
    return args, {**kwargs, "adapter_names": adapter_names}
