"""Per-token KL estimators of KL(pi || pi_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

With ``d = logp - ref_logp`` (log-probs of the sampled tokens under the policy and the reference):
k1 is unbiased but noisy, k2 is low-variance but biased, k3 is unbiased, low-variance and >= 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LOG_RATIO_LIMIT = 20.0


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k1 = d``."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k2 = d^2 / 2``."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k3 = exp(-d) + d - 1`` (``d`` clamped to +-20 so the exponential stays finite)."""
    d = (logp - ref_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return torch.exp(-d) + d - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "k2": kl_k2, "k3": kl_k3,
}
