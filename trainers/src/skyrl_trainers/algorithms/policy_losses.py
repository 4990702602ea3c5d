"""Policy-gradient surrogate losses, per token (reduce them with :mod:`.reductions`).

Notation: ``logp`` are the current policy's log-probs of the sampled tokens, ``old_logp`` those of
the policy that produced the data, ``r = exp(logp - old_logp)``, ``A`` the advantage broadcast over
the tokens of its sequence. Every function returns the per-token loss and a 0/1 tensor marking the
tokens where clipping changed the loss (for the clip-fraction metric).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

_LOG_RATIO_LIMIT = 20.0


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor
    clipped: torch.Tensor


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float,
                       eps_high: float) -> PolicyLossOutput:
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    return PolicyLossOutput(loss, (clipped > unclipped).float())


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2) -> PolicyLossOutput:
    """PPO clipped surrogate: ``L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``.

    ``eps_high > eps_low`` gives DAPO's clip-higher. ``mask`` is unused (a uniform signature).
    """
    del mask
    return _clipped_surrogate(_ratio(logp, old_logp), advantages, eps_low, eps_high)


def dual_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                   eps_low: float = 0.2, eps_high: float = 0.2, clip_c: float = 3.0) -> PolicyLossOutput:
    """Dual-clip PPO: for ``A < 0`` the PPO loss is further bounded, ``L = min(L_ppo, -c A)`` (``c > 1``),
    so a huge ratio on a bad token cannot blow up the update; for ``A >= 0`` it is ``L_ppo``.
    """
    del mask
    base, clipped = _clipped_surrogate(_ratio(logp, old_logp), advantages, eps_low, eps_high)
    bound = -clip_c * advantages
    dual = (advantages < 0) & (bound < base)
    loss = torch.where(dual, bound, base)
    return PolicyLossOutput(loss, torch.maximum(clipped, dual.float()))


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4) -> PolicyLossOutput:
    """GSPO (token form): a sequence-level ratio ``s_i = exp(mean_t (logp - old_logp))`` over the
    masked tokens of sequence ``i``, carried per token as ``r_it = sg(s_i) * exp(logp_it - sg(logp_it))``
    (value ``s_i``, gradient of ``logp_it``), then the PPO clip with GSPO's small epsilons.

    Rows are sequences (dim 0); ``mask`` marks their response tokens.
    """
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * mask
    seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + logp - logp.detach()
    ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    return _clipped_surrogate(ratio, advantages, eps_low, eps_high)


POLICY_LOSSES: dict[str, Callable[..., PolicyLossOutput]] = {
    "ppo_clip": ppo_clip_loss, "dual_clip": dual_clip_loss, "gspo": gspo_loss,
}
