"""Loss reductions whose gradient does not depend on how the batch is split into micro-batches.

Each call reduces one micro-batch's per-token loss to *its share* of the batch loss, using
normalisers computed over the whole batch (all micro-batches on all ranks). Summing the shares of
every micro-batch gives exactly the full-batch loss, so accumulating gradients over any split gives
the same gradient. With ``l_it`` the per-token loss, ``m_it`` the mask, ``B`` the batch's sequence
count and ``N = sum m`` its token count:

* ``token_mean``:              ``sum_i sum_t m_it l_it / N``
* ``sequence_mean``:           ``(1/B) sum_i (sum_t m_it l_it / sum_t m_it)``
* ``sequence_mean_token_sum``: ``(1/B) sum_i sum_t m_it l_it / norm`` (Dr. GRPO; ``norm`` a constant such as
  the max response length, default 1)
"""

from __future__ import annotations

import torch

LOSS_REDUCTIONS = ("token_mean", "sequence_mean", "sequence_mean_token_sum")


def reduce_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, *, batch_tokens: float,
                batch_sequences: float, norm: float = 1.0) -> torch.Tensor:
    """This micro-batch's share of the batch loss (rows of ``loss``/``mask`` are sequences)."""
    mask = mask.to(loss.dtype)
    masked = loss * mask
    if mode == "token_mean":
        return masked.sum() / max(batch_tokens, 1.0)
    if mode == "sequence_mean":
        per_sequence = masked.sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence.sum() / max(batch_sequences, 1.0)
    if mode == "sequence_mean_token_sum":
        return masked.sum() / (max(batch_sequences, 1.0) * norm)
    raise ValueError(f"unknown loss_reduction {mode!r}; choose from {', '.join(LOSS_REDUCTIONS)}")
