"""RL algorithms as small pure torch functions: advantages, policy losses, KL estimators, reductions,
off-policy (truncated importance sampling) weights."""

from skyrl_trainers.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from skyrl_trainers.algorithms.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from skyrl_trainers.algorithms.off_policy import TIS_LEVELS, tis_weights
from skyrl_trainers.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossOutput,
    dual_clip_loss,
    gspo_loss,
    ppo_clip_loss,
)
from skyrl_trainers.algorithms.reductions import LOSS_REDUCTIONS, reduce_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS", "grpo_advantages", "rloo_advantages", "reinforce_pp_advantages",
    "KL_ESTIMATORS", "kl_k1", "kl_k2", "kl_k3",
    "POLICY_LOSSES", "PolicyLossOutput", "ppo_clip_loss", "dual_clip_loss", "gspo_loss",
    "LOSS_REDUCTIONS", "reduce_loss",
    "TIS_LEVELS", "tis_weights",
]
