"""The training objective of one micro-batch: policy loss, optional KL and entropy terms, metrics.

Kept apart from the distributed worker so it can be checked on a plain model (for example that
accumulating it over any micro-batch split gives the full-batch gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl_trainers.algorithms import KL_ESTIMATORS, POLICY_LOSSES, reduce_loss, tis_weights
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.forward import CarriedPrompts, MicroBatch, token_logprobs
from skyrl_trainers.prompt_cache import PromptCache


@dataclass
class Normalisers:
    """Sizes of the whole mini-batch (all micro-batches on all ranks) that the reductions divide by."""

    batch_tokens: float
    batch_sequences: float


def micro_batch_loss(cfg: FSDPGRPOConfig, model: torch.nn.Module, batch: MicroBatch, norms: Normalisers, *,
                     old_logp: torch.Tensor | None = None, ref_model: torch.nn.Module | None = None,
                     temperature: float = 1.0, prompts: PromptCache | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the mini-batch loss, and metric sums for the step's report.

    ``old_logp`` defaults to the current log-probs without gradient (one update per rollout batch,
    where PPO's ratio is 1 at the start of the update). With ``cfg.off_policy.tis`` other than
    ``none`` the per-token policy loss is multiplied by truncated importance weights from
    ``old_logp`` over the rollout log-probs (:func:`~.algorithms.off_policy.tis_weights`). A batch whose
    rows carry their prompts takes their keys and values from ``prompts``.
    """
    logp, entropy = token_logprobs(model, batch, temperature=temperature, entropy_grad=cfg.entropy_coef > 0,
                                   trained_only=True, carried=carried_states(prompts, model, batch))
    old_logp = logp.detach() if old_logp is None else old_logp
    mask = batch.mask
    options: dict[str, float] = {k: v for k, v in (("eps_low", cfg.clip_eps_low), ("eps_high", cfg.clip_eps_high))
                                 if v is not None}
    if cfg.policy_loss == "dual_clip":
        options["clip_c"] = cfg.dual_clip_c
    policy = POLICY_LOSSES[cfg.policy_loss](logp, old_logp, batch.advantages, mask, **options)
    per_token = policy.loss
    tis_metrics: dict[str, float] = {}
    # ``auto`` is decided by the trainer before its ranks are built (numerics.decide_numerics); a worker
    # driven directly, which cannot know the sampler, treats it as none
    if cfg.off_policy.tis not in ("none", "auto"):
        weights, tis_metrics = tis_weights(old_logp, batch.rollout_logprobs, mask, cfg.off_policy)
        per_token = per_token * weights
    sizes = {"batch_tokens": norms.batch_tokens, "batch_sequences": norms.batch_sequences, "norm": cfg.loss_norm}
    policy_loss = reduce_loss(per_token, mask, cfg.loss_reduction, **sizes)
    loss = policy_loss
    kl = torch.zeros_like(logp)
    if ref_model is not None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(ref_model, batch, temperature=temperature, trained_only=True,
                                         carried=carried_states(prompts, ref_model, batch))
        kl = KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp) * mask
        loss = loss + cfg.kl_coef * reduce_loss(kl, mask, cfg.loss_reduction, **sizes)
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * reduce_loss(entropy, mask, cfg.loss_reduction, **sizes)
    gap = (logp.detach() - batch.rollout_logprobs).abs() * mask
    metrics = {"loss": loss.item(), "policy_loss": policy_loss.item(), "tokens": mask.sum().item(),
               "kl_sum": kl.detach().sum().item(), "entropy_sum": (entropy.detach() * mask).sum().item(),
               "clipped_sum": (policy.clipped * mask).sum().item(), "logprob_gap_sum": gap.sum().item(),
               "logprob_gap_max": gap.max().item(), **tis_metrics}
    return loss, metrics


def carried_states(prompts: PromptCache | None, model: torch.nn.Module, batch: MicroBatch) -> CarriedPrompts | None:
    """The keys and values under ``model`` of the prompts ``batch``'s rows carry (``None`` if they carry none)."""
    if batch.carried_prompts is None:
        return None
    if prompts is None:
        raise ValueError("this micro-batch's rows carry their prompts: pass the mini-batch's PromptCache")
    return prompts.rows(model, batch.carried_prompts)
