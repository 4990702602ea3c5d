"""Off-policy correction (truncated importance sampling) against hand-computed weights, in the loss and config."""

import math
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from skyrl_core.config import build_config
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry
from skyrl_trainers.algorithms import POLICY_LOSSES, reduce_loss, tis_weights
from skyrl_trainers.batching import TrainSample
from skyrl_trainers.config import FSDPGRPOConfig, OffPolicyCorrection
from skyrl_trainers.forward import collate, token_logprobs
from skyrl_trainers.models import build_tiny_random
from skyrl_trainers.numerics import resolve_tis
from skyrl_trainers.objective import Normalisers, micro_batch_loss
from skyrl_trainers.trainer import train_metrics

# 2 sequences x 3 tokens; the last token of row 1 is not trained (an observation token) and has a
# wild log-ratio (-0.1 - -9.0 = 8.9) that must not count anywhere.
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.1]])
ROLLOUT = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, -0.2, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# log rho on trained tokens: row 0 [0.5, 0.0, -1.0], row 1 [0.7, -1.0]
E = math.exp


def options(tis, token_cap=2.0, sequence_cap=5.0):
    return OffPolicyCorrection(tis=tis, token_cap=token_cap, sequence_cap=sequence_cap)


def test_token_tis_hand_computed():
    weights, metrics = tis_weights(OLD, ROLLOUT, MASK, options("token", token_cap=2.0))
    # rho = e^0.5 = 1.6487, e^0 = 1, e^-1 = 0.3679 | e^0.7 = 2.0138 -> capped at 2, e^-1 = 0.3679 | masked: 0
    expected = [[E(0.5), 1.0, E(-1.0)], [2.0, E(-1.0), 0.0]]
    assert weights.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    assert metrics["is_ratio_sum"] == pytest.approx(E(0.5) + 1 + E(-1) + E(0.7) + E(-1), abs=1e-5)  # 5.3983
    assert metrics["is_ratio_max"] == pytest.approx(E(0.7), abs=1e-5)  # 2.0138, uncapped
    assert metrics["tis_clipped_sum"] == 1.0  # only row 1's first token hit the cap
    assert metrics["is_unknown_sum"] == 0.0


def test_sequence_tis_hand_computed():
    # row 0: exp(0.5 + 0 - 1) = e^-0.5 = 0.6065; row 1: exp(0.7 - 1.0) = e^-0.3 = 0.7408 (masked token ignored)
    weights, metrics = tis_weights(OLD, ROLLOUT, MASK, options("sequence", sequence_cap=5.0))
    assert weights.tolist() == [pytest.approx([E(-0.5)] * 3, abs=1e-6), pytest.approx([E(-0.3)] * 2 + [0.0], abs=1e-6)]
    assert metrics["tis_clipped_sum"] == 0.0
    # a cap of 0.7 clips row 1 (0.7408 -> 0.7): its 2 trained tokens count as clipped
    weights, metrics = tis_weights(OLD, ROLLOUT, MASK, options("sequence", sequence_cap=0.7))
    assert weights.tolist() == [pytest.approx([E(-0.5)] * 3, abs=1e-6), pytest.approx([0.7, 0.7, 0.0], abs=1e-6)]
    assert metrics["tis_clipped_sum"] == 2.0
    # the ratio metrics are per token in both modes
    assert metrics["is_ratio_sum"] == pytest.approx(E(0.5) + 1 + E(-1) + E(0.7) + E(-1), abs=1e-5)
    # a sequence whose product exceeds the cap: exp(0.5 + 0.6 + 0.7) = e^1.8 = 6.05 -> 5
    weights, _ = tis_weights(torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[-0.5, -0.6, -0.7]]),
                             torch.ones(1, 3), options("sequence"))
    assert weights.tolist() == [pytest.approx([5.0] * 3)]


def test_weights_carry_no_gradient():
    old = OLD.clone().requires_grad_(True)
    for tis in ("token", "sequence"):
        weights, _ = tis_weights(old, ROLLOUT, MASK, options(tis))
        assert not weights.requires_grad and weights.grad_fn is None


def test_masked_tokens_do_not_count():
    base = {tis: tis_weights(OLD, ROLLOUT, MASK, options(tis)) for tis in ("token", "sequence")}
    wild_old, wild_rollout = OLD.clone(), ROLLOUT.clone()
    wild_old[1, 2], wild_rollout[1, 2] = 0.0, -1e4  # an absurd ratio on the untrained token
    for tis, (weights, metrics) in base.items():
        other_weights, other_metrics = tis_weights(wild_old, wild_rollout, MASK, options(tis))
        assert torch.equal(other_weights, weights)
        assert other_metrics == metrics
    # a batch with no trained token (the dummy row of an empty micro-batch) has zero weights and metrics
    weights, metrics = tis_weights(OLD, ROLLOUT, torch.zeros_like(MASK), options("token"))
    assert weights.abs().max() == 0
    assert metrics == {"is_ratio_sum": 0.0, "is_ratio_max": 0.0, "tis_clipped_sum": 0.0, "is_unknown_sum": 0.0}


def test_missing_rollout_logprob_counts_as_on_policy_and_extremes_stay_finite():
    # 0.0 is what the generator records when the engine returned no logprobs: rho = 1 there
    old = torch.tensor([[-1.0, 30.0, -50.0]])
    rollout = torch.tensor([[0.0, -30.0, 0.5]])
    weights, metrics = tis_weights(old, rollout, torch.ones(1, 3), options("token"))
    assert weights.tolist() == [pytest.approx([1.0, 2.0, E(-20)])]  # log-ratios 60 and -50.5 clamp to +-20
    assert metrics["is_unknown_sum"] == 1.0
    assert metrics["is_ratio_max"] == pytest.approx(E(20))
    seq, _ = tis_weights(torch.full((1, 8), -30.0), torch.full((1, 8), -1.0), torch.ones(1, 8), options("sequence"))
    assert torch.isfinite(seq).all() and seq[0, 0] == pytest.approx(E(-20))  # sum -232 clamps to -20


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="off_policy.tis"):
        tis_weights(OLD, ROLLOUT, MASK, SimpleNamespace(tis="tokens", token_cap=2.0, sequence_cap=5.0))


# -- in the loss -------------------------------------------------------------------------------------


def micro_batch():
    """Three samples (one with an observation token) and rollout log-probs near the model's own."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for prompt, response, advantage in [(4, 5, 1.0), (6, 3, -0.5), (3, 6, 2.0)]:
        ids = torch.randint(10, 500, (prompt + response,), generator=generator).tolist()
        mask = [1] * response
        if response == 6:
            mask[2] = 0
        out.append(TrainSample(ids, prompt, mask, [0.0] * response, advantage))
    return collate(out)


def with_rollout(model, batch, seed=2):
    """``batch`` with rollout log-probs = the model's log-probs + noise in [-1, 1] on trained tokens."""
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch)
    noise = torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    batch.rollout_logprobs = (logp + noise) * batch.mask
    return batch


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def hand_weighted_gradient(model, batch, norms, weight_fn):
    """Gradient of sum_t w_t * (-A_t * exp(logp_t - sg(logp_t))) * m_t / N with w computed here."""
    model.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(model, batch)
    log_rho = (logp.detach() - batch.rollout_logprobs) * batch.mask
    weights = weight_fn(log_rho) * batch.mask
    per_token = -batch.advantages * torch.exp(logp - logp.detach())
    ((weights * per_token * batch.mask).sum() / norms.batch_tokens).backward()
    return grads(model)


@pytest.mark.parametrize(("tis", "weight_fn"), [
    ("token", lambda log_rho: torch.exp(log_rho).clamp(max=2.0)),
    ("sequence", lambda log_rho: torch.exp(log_rho.sum(-1, keepdim=True)).clamp(max=5.0).expand_as(log_rho)),
])
def test_gradient_on_a_tiny_model_is_the_hand_weighted_one(tis, weight_fn):
    model, _ = build_tiny_random()
    model.train()
    batch = with_rollout(model, micro_batch())
    norms = Normalisers(float(batch.mask.sum()), 3.0)
    cfg = FSDPGRPOConfig(model="tiny-random", off_policy={"tis": tis})
    model.zero_grad(set_to_none=True)
    loss, metrics = micro_batch_loss(cfg, model, batch, norms)
    loss.backward()
    got = grads(model)
    expected = hand_weighted_gradient(model, batch, norms, weight_fn)
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))
    # the weights are not all 1, so the check is not vacuous; the metrics are there
    plain = hand_weighted_gradient(model, batch, norms, lambda log_rho: torch.ones_like(log_rho))
    assert not torch.allclose(plain, expected, rtol=1e-3)
    assert {"is_ratio_sum", "is_ratio_max", "tis_clipped_sum", "is_unknown_sum"} <= metrics.keys()
    if tis == "token":
        assert metrics["tis_clipped_sum"] > 0  # noise up to +1 in log space exceeds log 2 somewhere


def test_tis_none_leaves_the_loss_unchanged():
    model, _ = build_tiny_random()
    model.train()
    batch = with_rollout(model, micro_batch())
    norms = Normalisers(float(batch.mask.sum()), 3.0)
    cfg = FSDPGRPOConfig(model="tiny-random", loss_reduction="sequence_mean", off_policy={"tis": "none"})
    model.zero_grad(set_to_none=True)
    loss, metrics = micro_batch_loss(cfg, model, batch, norms)
    loss.backward()
    got = grads(model)
    assert not {"is_ratio_sum", "is_ratio_max", "tis_clipped_sum"} & metrics.keys()
    # the loss as computed without off-policy correction
    model.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(model, batch)
    policy = POLICY_LOSSES["ppo_clip"](logp, logp.detach(), batch.advantages, batch.mask)
    before = reduce_loss(policy.loss, batch.mask, "sequence_mean", batch_tokens=norms.batch_tokens,
                         batch_sequences=norms.batch_sequences)
    before.backward()
    assert loss.item() == pytest.approx(before.item(), rel=1e-6)
    torch.testing.assert_close(got, grads(model), rtol=1e-5, atol=0.0)


def test_token_tis_on_policy_samples_changes_nothing():
    """With rollout log-probs equal to the old policy's, every weight is 1."""
    model, _ = build_tiny_random()
    model.train()
    batch = micro_batch()
    with torch.no_grad():
        batch.rollout_logprobs = token_logprobs(model, batch)[0] * batch.mask
    norms = Normalisers(float(batch.mask.sum()), 3.0)
    plain, _ = micro_batch_loss(FSDPGRPOConfig(model="tiny-random"), model, batch, norms)
    corrected, metrics = micro_batch_loss(FSDPGRPOConfig(model="tiny-random", off_policy={"tis": "token"}),
                                          model, batch, norms)
    assert corrected.item() == pytest.approx(plain.item(), rel=1e-6)
    assert metrics["is_ratio_sum"] == pytest.approx(metrics["tokens"], rel=1e-5)
    assert metrics["tis_clipped_sum"] == 0.0


def test_train_metrics_report_the_correction():
    rank0 = {"tokens": 4.0, "optimizer_steps": 1.0, "is_ratio_sum": 4.4, "is_ratio_max": 1.5,
             "tis_clipped_sum": 1.0, "is_unknown_sum": 0.0}
    rank1 = {"tokens": 6.0, "optimizer_steps": 1.0, "is_ratio_sum": 5.6, "is_ratio_max": 2.5,
             "tis_clipped_sum": 2.0, "is_unknown_sum": 1.0}
    out = train_metrics([rank0, rank1])
    assert out["train/is_ratio_mean"] == pytest.approx(1.0)
    assert out["train/is_ratio_max"] == 2.5
    assert out["train/tis_clip_fraction"] == pytest.approx(0.3)
    assert out["train/is_unknown_fraction"] == pytest.approx(0.1)
    assert "train/is_ratio_mean" not in train_metrics([{"tokens": 4.0, "optimizer_steps": 1.0}])


# -- config ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["async", "one_step_off"])
def test_off_sync_modes_refuse_an_on_policy_loss(mode):
    with pytest.raises(ValidationError, match=r"trainer\.off_policy\.tis"):
        FSDPGRPOConfig(mode=mode, off_policy={"tis": "none"})
    with pytest.raises(ConfigError, match=rf"trainer\.mode={mode}.*trainer\.off_policy\.tis=none"):
        build_config({"env": {"id": "reverse_text"},
                      "trainer": {"id": "fsdp_grpo", "mode": mode, "off_policy": {"tis": "none"}}},
                     registry=get_registry())
    # the default, auto, corrects off sync
    auto = build_config({"env": {"id": "reverse_text"}, "trainer": {"id": "fsdp_grpo", "mode": mode}},
                        registry=get_registry())
    assert resolve_tis(auto) == ("token", f"trainer.mode={mode} samples with an older policy")
    for tis in ("token", "sequence"):
        assert FSDPGRPOConfig(mode=mode, off_policy={"tis": tis}).off_policy.tis == tis
    cfg = build_config({"env": {"id": "reverse_text"},
                        "trainer": {"id": "fsdp_grpo", "mode": mode, "off_policy": {"tis": "token"}}},
                       registry=get_registry())
    assert (cfg.trainer.mode, cfg.trainer.off_policy.tis, cfg.trainer.off_policy.token_cap) == (mode, "token", 2.0)


def test_sync_mode_accepts_every_level_and_caps_must_be_positive():
    for tis in ("none", "token", "sequence"):
        assert FSDPGRPOConfig(off_policy={"tis": tis}).mode == "sync"
    with pytest.raises(ValidationError, match="token_cap"):
        FSDPGRPOConfig(off_policy={"tis": "token", "token_cap": 0})
    with pytest.raises(ValidationError, match="tis"):
        FSDPGRPOConfig(off_policy={"tis": "tokens"})
