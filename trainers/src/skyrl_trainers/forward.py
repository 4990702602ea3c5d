"""Collate training samples into padded tensors and compute per-token log-probs and entropy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skyrl_trainers.batching import TrainSample


@dataclass
class MicroBatch:
    """Tensors of one micro-batch, aligned with the predicted tokens ``input_ids[:, offset + 1:]``.

    Only positions from ``offset`` on get logits: every response starts after it, so prompt-only
    positions never materialise a vocabulary-sized row.
    """

    input_ids: torch.Tensor       # [b, L]
    attention_mask: torch.Tensor  # [b, L]
    offset: int
    mask: torch.Tensor            # [b, L - offset - 1], 1 where a generated token is trained on
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor      # [b, L - offset - 1], the sequence's advantage on every position

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.offset,
                          self.mask.to(device), self.rollout_logprobs.to(device), self.advantages.to(device))


def collate(samples: Sequence[TrainSample], pad_id: int = 0) -> MicroBatch:
    """Right-pad ``samples``; an empty list gives a 2-token dummy row with nothing to train on."""
    if not samples:
        samples = [TrainSample([pad_id, pad_id], 1, [0], [0.0], 0.0)]
    length = max(len(s.input_ids) for s in samples)
    offset = max(0, min(s.response_start for s in samples) - 1)
    width = length - offset - 1
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), length), dtype=torch.long)
    mask = torch.zeros((len(samples), width))
    rollout = torch.zeros((len(samples), width))
    advantages = torch.zeros((len(samples), width))
    for row, s in enumerate(samples):
        ids[row, : len(s.input_ids)] = torch.tensor(s.input_ids)
        attention[row, : len(s.input_ids)] = 1
        # the response token at input position p is predicted at aligned column p - offset - 1
        start = s.response_start - offset - 1
        n = len(s.loss_mask)
        mask[row, start:start + n] = torch.tensor(s.loss_mask, dtype=torch.float)
        rollout[row, start:start + n] = torch.tensor(s.rollout_logprobs[:n], dtype=torch.float)
        advantages[row] = s.advantage
    return MicroBatch(ids, attention, offset, mask, rollout, advantages)


# Model types whose causal-LM forward is exactly ``logits = lm_head(hidden[:, slice])`` (no logit
# scaling or soft-capping after the head), so log-probs can be computed from the head's input.
CHUNKABLE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
CHUNK_ROWS = 256  # tokens per chunk: 256 x 49152 fp32 logits is 48 MiB


def token_logprobs(model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the tokens at ``input_ids[:, offset + 1:]`` under ``model`` (logits / temperature)
    and the entropy of each predictive distribution (differentiable only with ``entropy_grad``).

    For a plain bias-free ``nn.Linear`` head of a known model type (see ``CHUNKABLE_MODEL_TYPES``) the
    vocabulary-sized logits are never held for the whole micro-batch: hooks on the head take its input
    inside the model's own forward (so an FSDP2 root sees its parameters used while unsharded and
    registers its backward hooks on the result) and :class:`ChunkedLogProbs` computes log-probs and
    entropy a chunk of rows at a time. Other heads (biases, scaled or soft-capped logits) take the
    plain full-logits path.
    """
    keep = batch.input_ids.shape[1] - batch.offset
    targets = batch.input_ids[:, batch.offset + 1:]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    if (type(head) is not torch.nn.Linear or head.bias is not None
            or getattr(config, "model_type", None) not in CHUNKABLE_MODEL_TYPES):
        return _full_logits_logprobs(model, batch, keep, targets, temperature, entropy_grad)
    differentiable = entropy_grad and torch.is_grad_enabled()

    def take_input(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden.append(args[0])
        return (args[0][:, :0],)  # the head itself computes no logits

    def replace_output(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        h = hidden.pop()[:, :-1]
        logp, entropy = ChunkedLogProbs.apply(h.reshape(-1, h.shape[-1]), module.weight, targets.reshape(-1),
                                              temperature, differentiable, CHUNK_ROWS)
        # a fresh tensor, not a view: FSDP2 hooks its backward onto the root's output
        return torch.stack([logp.view(targets.shape), entropy.view(targets.shape)], dim=-1)

    hidden: list[torch.Tensor] = []
    hooks = [head.register_forward_pre_hook(take_input), head.register_forward_hook(replace_output)]
    try:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep,
                    use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    return out[..., 0], out[..., 1] if differentiable else out[..., 1].detach()


def _full_logits_logprobs(model: torch.nn.Module, batch: MicroBatch, keep: int, targets: torch.Tensor,
                          temperature: float, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep,
                   use_cache=False).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


class ChunkedLogProbs(torch.autograd.Function):
    """``(logp, entropy)`` of ``targets`` under ``softmax(hidden @ weight.T / temperature)``, in row chunks.

    Saves only ``hidden`` and ``weight``; backward recomputes each chunk's logits. With ``z`` the
    scaled logits and ``p`` their softmax: d logp / dz = onehot - p and d H / dz = -p (log p + H).
    Logits are taken in the inputs' dtype (as the head would), then softmaxed in float32.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                entropy_grad: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature, ctx.entropy_grad, ctx.chunk = temperature, entropy_grad, chunk
        logp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(logp)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                rows = slice(start, start + chunk)
                log_p = _chunk_log_softmax(hidden[rows], weight, temperature)
                logp[rows] = log_p.gather(-1, targets[rows, None]).squeeze(-1)
                entropy[rows] = -(log_p.exp() * log_p).sum(-1)
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.chunk):
                rows = slice(start, start + ctx.chunk)
                log_p = _chunk_log_softmax(hidden[rows], weight, ctx.temperature)
                p = log_p.exp()
                grad_z = p * -grad_logp[rows, None]
                grad_z.scatter_add_(-1, targets[rows, None], grad_logp[rows, None])
                if ctx.entropy_grad and grad_entropy is not None:
                    h = -(p * log_p).sum(-1, keepdim=True)
                    grad_z -= grad_entropy[rows, None] * p * (log_p + h)
                grad_z = (grad_z / ctx.temperature).to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = grad_z @ weight.to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight.addmm_(grad_z.T.float(), hidden[rows].float())
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None, None, None, None)


def _chunk_log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = (hidden @ weight.to(hidden.dtype).T).float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)
