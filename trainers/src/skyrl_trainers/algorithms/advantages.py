"""Outcome advantage estimators: one scalar score per sequence in, one advantage per sequence out.

``groups`` holds an integer group id per sequence (the samples of one task share an id). Scores that
span no more than :data:`FLAT_SPREAD` count as equal and get advantage 0 exactly: the mean of equal
doubles can miss them by an ulp, which a near-zero std would blow up to about 1e-10, and the trainer
leaves samples of advantage 0 out of its forward and backward passes (their gradient is zero).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

FLAT_SPREAD = 1e-9
"""Scores of a group (or batch) closer together than this are one score: no signal, advantage 0."""


def _group_stats(scores: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence group size, offset from the group mean (exactly 0 in a flat group) and unbiased
    group std (0 for groups of one)."""
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inverse, scores)
    means = sums / counts
    squares = torch.zeros(len(counts), dtype=scores.dtype).index_add_(0, inverse, (scores - means[inverse]) ** 2)
    stds = torch.where(counts > 1, (squares / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(means))
    highs = torch.empty(len(counts), dtype=scores.dtype).scatter_reduce_(0, inverse, scores, "amax", include_self=False)
    lows = torch.empty(len(counts), dtype=scores.dtype).scatter_reduce_(0, inverse, scores, "amin", include_self=False)
    flat = (highs - lows <= FLAT_SPREAD)[inverse]
    centred = torch.where(flat, torch.zeros_like(scores), scores - means[inverse])
    return counts[inverse], centred, stds[inverse]


def grpo_advantages(scores: torch.Tensor, groups: torch.Tensor, *, norm_by_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO group z-score.

    ``A_i = (s_i - mean_g) / (std_g + eps)`` with the unbiased std of the group, or ``A_i = s_i - mean_g``
    when ``norm_by_std`` is False (Dr. GRPO). A group of one has no baseline: ``A_i = s_i``.
    """
    scores = scores.double()
    counts, centred, stds = _group_stats(scores, groups)
    advantages = centred / (stds + eps) if norm_by_std else centred
    return torch.where(counts > 1, advantages, scores).float()


def rloo_advantages(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: the baseline is the mean of the *other* samples of the group.

    ``A_i = s_i - (sum_g - s_i) / (n - 1) = (s_i - mean_g) * n / (n - 1)``; a group of one gets ``A_i = 0``.
    """
    scores = scores.double()
    counts, centred, _ = _group_stats(scores, groups)
    n = counts.to(scores.dtype)
    advantages = centred * n / (n - 1).clamp(min=1)
    return torch.where(counts > 1, advantages, torch.zeros_like(scores)).float()


def reinforce_pp_advantages(scores: torch.Tensor, groups: torch.Tensor, *, num_tokens: torch.Tensor,
                            eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ with outcome rewards (gamma = 1): the return of every token is its sequence's score,
    whitened over all response tokens of the batch, with no group baseline.

    ``A_i = (s_i - mu) / sqrt(var + eps)`` where ``mu = sum_i n_i s_i / N`` and
    ``var = sum_i n_i (s_i - mu)^2 / (N - 1)`` over the ``N = sum_i n_i`` tokens (``n_i = num_tokens[i]``).
    ``groups`` is accepted for a uniform signature and ignored.
    """
    del groups
    scores = scores.double()
    weights = num_tokens.double()
    total = weights.sum()
    if total <= 1 or scores.max() - scores.min() <= FLAT_SPREAD:
        return torch.zeros_like(scores).float()
    mean = (weights * scores).sum() / total
    var = (weights * (scores - mean) ** 2).sum() / (total - 1)
    return ((scores - mean) * torch.rsqrt(var + eps)).float()


AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}
