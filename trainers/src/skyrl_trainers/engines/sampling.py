"""Turn a batch of next-token logits into sampled tokens and their logprobs, one parameter set per row.

Logprob modes (what ``GenerateOutput.logprobs`` holds):

* ``processed`` (default): the log-probability of the sampled token under the distribution it was
  actually drawn from, i.e. ``log_softmax(logits / temperature)`` restricted to the top-k / top-p
  set and renormalised. With top-k/top-p off this equals what a trainer computes with logits divided
  by the sampling temperature, so the importance ratio starts at 1.
* ``raw``: ``log_softmax(logits)`` of the unmodified model, as vLLM and SkyRL return by default.

Greedy rows (temperature 0) always report the raw model logprob: the greedy "distribution" is a
point mass whose log-probability (0) carries no information.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

LogprobMode = Literal["processed", "raw"]


@dataclass(frozen=True)
class RowParams:
    """Sampling settings for one row of the batch."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None


def sample_next(logits: torch.Tensor, rows: Sequence[RowParams], mode: LogprobMode = "processed"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled token ids ``(B,)`` and their logprobs ``(B,)`` for ``logits`` of shape ``(B, V)``."""
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    greedy = torch.tensor([r.temperature == 0 for r in rows], device=logits.device)
    tokens = raw.argmax(dim=-1)
    logprobs = raw.gather(1, tokens[:, None]).squeeze(1)
    if bool(greedy.all()):
        return tokens, logprobs
    processed = processed_logprobs(logits, rows)
    probs = processed.exp()
    for i, row in enumerate(rows):
        if row.temperature > 0:
            tokens[i] = torch.multinomial(probs[i], 1, generator=row.generator)[0]
    chosen = processed if mode == "processed" else raw
    sampled_logprobs = chosen.gather(1, tokens[:, None]).squeeze(1)
    return tokens, torch.where(greedy, logprobs, sampled_logprobs)


def processed_logprobs(logits: torch.Tensor, rows: Sequence[RowParams]) -> torch.Tensor:
    """``log_softmax`` of temperature-scaled logits with tokens outside top-k / top-p set to -inf."""
    vocab = logits.shape[-1]
    temperature = torch.tensor([r.temperature if r.temperature > 0 else 1.0 for r in rows],
                               device=logits.device, dtype=logits.dtype)
    scaled = logits / temperature[:, None]
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=logits.device)
    top_p = torch.tensor([r.top_p for r in rows], device=logits.device, dtype=logits.dtype)
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        drop = rank >= top_k[:, None]
        sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop |= mass_before >= top_p[:, None]  # the most likely token is always kept (mass_before = 0)
        scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return torch.log_softmax(scaled, dim=-1)
