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
# A positive temperature below this samples as this one does: dividing logits by 1e-40 overflows float32 to
# inf, and the NaN that follows would pick the vocabulary's last id every time. (vLLM uses the same floor.)
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class RowParams:
    """Sampling settings for one row of the batch."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None


def sample_next(logits: torch.Tensor, rows: Sequence[RowParams], mode: LogprobMode = "processed"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled token ids ``(B,)`` and their logprobs ``(B,)`` for ``logits`` of shape ``(B, V)``.

    Each sampled row draws one uniform number from its own generator and takes the token where it
    falls in the row's cumulative distribution (inverse-CDF sampling), so a seeded row gives the same
    tokens whatever it is batched with. Only the logprobs of the chosen tokens are computed (from
    one log-sum-exp per row), never a full ``(B, V)`` log-softmax that the caller would not read.
    """
    logits = logits.float()
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if len(sampled) < len(rows):
        tokens = logits.argmax(dim=-1)
        raw = _chosen_logprobs(logits, tokens, logits.logsumexp(dim=-1))
    if not sampled:
        return tokens, raw
    if len(sampled) < len(rows):
        sampled_rows = [rows[i] for i in sampled]
        scaled = _processed_logits(logits[sampled], sampled_rows)
    else:
        sampled_rows, scaled = list(rows), _processed_logits(logits, rows)
    peak = scaled.amax(dim=-1, keepdim=True)
    mass = (scaled - peak).exp_()  # unnormalised probabilities; masked tokens have 0
    uniform = torch.cat([torch.rand(1, generator=r.generator, device=logits.device, dtype=torch.float64)
                         for r in sampled_rows])
    chosen, total = _inverse_cdf(mass, uniform)
    if mode == "processed":
        lse = peak.squeeze(1).double() + total.log()
        chosen_logprobs = (scaled.gather(1, chosen[:, None]).squeeze(1).double() - lse).float()
    if len(sampled) == len(rows):
        return chosen, chosen_logprobs if mode == "processed" else _chosen_logprobs(
            logits, chosen, logits.logsumexp(dim=-1))
    index = torch.tensor(sampled, device=logits.device)
    tokens = tokens.index_copy(0, index, chosen)
    if mode == "processed":
        return tokens, raw.index_copy(0, index, chosen_logprobs)
    return tokens, _chosen_logprobs(logits, tokens, logits.logsumexp(dim=-1))


def _inverse_cdf(mass: torch.Tensor, uniform: torch.Tensor, block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the first token whose cumulative mass exceeds ``uniform * total``, and the total (float64).

    Two levels, so that no full-vocabulary cumulative sum is needed: the block holding the token is
    found from per-block sums, then the token from a cumulative sum inside that block only.
    """
    rows, vocab = mass.shape
    if vocab % block:
        mass = torch.nn.functional.pad(mass, (0, block - vocab % block))
    blocks = mass.view(rows, -1, block)
    sums = blocks.sum(dim=-1).double()  # float32 partial sums: a float64 copy of the whole row costs more
    ends = sums.cumsum(dim=-1)
    total = ends[:, -1]
    target = (uniform * total)[:, None]
    b = torch.searchsorted(ends, target, right=True).clamp_(max=ends.shape[1] - 1)
    inner = blocks[torch.arange(rows, device=mass.device), b.squeeze(1)]
    inner_ends = (ends.gather(1, b) - sums.gather(1, b)) + inner.cumsum(dim=-1, dtype=torch.float64)
    j = torch.searchsorted(inner_ends, target, right=True).squeeze(1)
    # Rounding can put the target past the block's last token of nonzero mass: take that token.
    last = block - 1 - (inner > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return b.squeeze(1) * block + torch.minimum(j, last), total


def _chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, tokens[:, None]).squeeze(1) - lse


def _processed_logits(logits: torch.Tensor, rows: Sequence[RowParams]) -> torch.Tensor:
    """Temperature-scaled logits with tokens outside top-k / top-p set to -inf (not normalised)."""
    vocab = logits.shape[-1]
    scaled = logits
    if any(r.temperature != 1.0 for r in rows):
        temperature = torch.tensor([max(r.temperature, MIN_TEMPERATURE) if r.temperature > 0 else 1.0 for r in rows],
                                   device=logits.device, dtype=logits.dtype)
        scaled = logits / temperature[:, None]
    if not any(0 < r.top_k < vocab or r.top_p < 1.0 for r in rows):
        return scaled
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=logits.device)
    top_p = torch.tensor([r.top_p for r in rows], device=logits.device, dtype=logits.dtype)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)[None, :]
    drop = rank >= top_k[:, None]
    sorted_probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # the most likely token is always kept, whatever top_p (a top_p that rounds to 0 included)
    drop |= (mass_before >= top_p[:, None]) & (rank > 0)
    return scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))


def processed_logprobs(logits: torch.Tensor, rows: Sequence[RowParams]) -> torch.Tensor:
    """``log_softmax`` of temperature-scaled logits with tokens outside top-k / top-p set to -inf."""
    return torch.log_softmax(_processed_logits(logits.float(), rows), dim=-1)
