"""Collate training samples into padded tensors and compute per-token log-probs and entropy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def token_logprobs(model: torch.nn.Module, batch: MicroBatch, *, temperature: float = 1.0,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the tokens at ``input_ids[:, offset + 1:]`` under ``model`` (logits / temperature)
    and the entropy of each predictive distribution (differentiable only with ``entropy_grad``)."""
    keep = batch.input_ids.shape[1] - batch.offset
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep,
                   use_cache=False).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, batch.offset + 1:]
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy
