"""Each RL algorithm against a hand-computed example."""

import math

import pytest
import torch
from skyrl_trainers.algorithms import (
    dual_clip_loss,
    grpo_advantages,
    gspo_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    ppo_clip_loss,
    reduce_loss,
    reinforce_pp_advantages,
    rloo_advantages,
)


def test_grpo_z_score_per_group_and_singleton_keeps_raw_score():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1])
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    expected = [0.866025, -0.866025, -0.866025, 0.866025, 0.5]
    assert grpo_advantages(scores, groups).tolist() == pytest.approx(expected, abs=1e-5)


def test_grpo_without_std_normalisation_only_centres():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    assert grpo_advantages(scores, groups, norm_by_std=False).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_equal_rewards_give_zero_advantage():
    assert grpo_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long)).abs().max() == 0


@pytest.mark.parametrize(("n", "score"), [(3, 0.013039117352056168), (5, 0.9989969909729187), (8, 0.0050150451354062184)])
def test_equal_double_rewards_give_exactly_zero_not_a_rounding_error(n, score):
    """The mean of ``n`` copies of each of these doubles misses it by an ulp; a std of about that would
    blow the offset up to 1e-12..1e-10, and the trainer only skips samples whose advantage is exactly 0."""
    scores = torch.full((n,), score, dtype=torch.float64)
    groups = torch.zeros(n, dtype=torch.long)
    assert grpo_advantages(scores, groups).abs().max() == 0
    assert grpo_advantages(scores, groups, norm_by_std=False).abs().max() == 0
    assert rloo_advantages(scores, groups).abs().max() == 0
    assert reinforce_pp_advantages(scores, groups, num_tokens=torch.ones(n)).abs().max() == 0
    # a real spread keeps its signal
    assert grpo_advantages(scores + torch.arange(n) * 1e-3, groups).abs().max() > 0.5


def test_rloo_leave_one_out_baseline():
    scores = torch.tensor([1.0, 0.0, 0.0, 7.0])
    groups = torch.tensor([3, 3, 3, 9])
    # 1 - (0 + 0)/2 = 1; 0 - (1 + 0)/2 = -0.5; a group of one gets 0
    assert rloo_advantages(scores, groups).tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0])


def test_reinforce_pp_token_weighted_whitening():
    scores = torch.tensor([1.0, 0.0])
    # 4 tokens: mean 0.25, Bessel variance (0.75^2 + 3 * 0.25^2) / 3 = 0.25, std 0.5
    out = reinforce_pp_advantages(scores, torch.tensor([0, 0]), num_tokens=torch.tensor([1, 3]))
    assert out.tolist() == pytest.approx([1.5, -0.5], abs=1e-4)


def test_kl_estimators():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    d = math.log(2)
    assert kl_k1(logp, ref).item() == pytest.approx(d)
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * d * d)
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 + d - 1)
    assert kl_k3(ref, ref).item() == 0.0
    assert torch.isfinite(kl_k3(torch.tensor([0.0]), torch.tensor([-1e4]))).all()


def test_ppo_clip():
    ratio = torch.tensor([1.5, 1.5, 0.5, 1.0])
    advantages = torch.tensor([1.0, -1.0, -1.0, 2.0])
    out = ppo_clip_loss(ratio.log(), torch.zeros(4), advantages, torch.ones(4))
    # -min(1.5, 1.2) ; -min(-1.5, -1.2) ; -min(-0.5, -0.8) ; -2
    assert out.loss.tolist() == pytest.approx([-1.2, 1.5, 0.8, -2.0])
    assert out.clipped.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_ppo_clip_higher_widens_upper_bound():
    out = ppo_clip_loss(torch.tensor([math.log(1.25)]), torch.zeros(1), torch.ones(1), torch.ones(1), eps_high=0.28)
    assert out.loss.item() == pytest.approx(-1.25)


def test_dual_clip_bounds_negative_advantages():
    ratio = torch.tensor([5.0, 2.0, 5.0])
    advantages = torch.tensor([-1.0, -1.0, 1.0])
    out = dual_clip_loss(ratio.log(), torch.zeros(3), advantages, torch.ones(3), clip_c=3.0)
    # ppo gives 5 -> bounded to 3; 2 < 3 stays; positive advantage: -min(5, 1.2)
    assert out.loss.tolist() == pytest.approx([3.0, 2.0, -1.2])
    assert out.clipped.tolist() == [1.0, 0.0, 1.0]


def test_gspo_uses_sequence_level_ratio_value_and_token_gradient():
    logp = torch.tensor([[0.2, 0.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = gspo_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), mask, eps_low=0.2, eps_high=0.2)
    s = math.exp(0.1)  # mean log-ratio over the two masked tokens
    assert out.loss[0, :2].tolist() == pytest.approx([-s, -s])
    (out.loss * mask).sum().backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([-s, -s])


def test_gspo_default_epsilons_clip_a_ten_percent_sequence_ratio():
    logp = torch.tensor([[0.2, 0.0]], requires_grad=True)
    out = gspo_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    assert out.loss.tolist()[0] == pytest.approx([-1.0004, -1.0004])
    assert out.clipped.tolist() == [[1.0, 1.0]]
    out.loss.sum().backward()
    assert logp.grad.abs().max() == 0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(("mode", "expected"), [
    ("token_mean", (6 + 4) / 4),
    ("sequence_mean", (6 / 3 + 4 / 1) / 2),
    ("sequence_mean_token_sum", (6 + 4) / (2 * 2.0)),
])
def test_reductions_by_hand_and_split_invariant(mode, expected):
    kwargs = {"batch_tokens": 4, "batch_sequences": 2, "norm": 2.0}
    whole = reduce_loss(LOSS, MASK, mode, **kwargs)
    split = reduce_loss(LOSS[:1], MASK[:1], mode, **kwargs) + reduce_loss(LOSS[1:], MASK[1:], mode, **kwargs)
    assert whole.item() == pytest.approx(expected)
    assert split.item() == pytest.approx(expected)


def test_unknown_reduction_names_the_choices():
    with pytest.raises(ValueError, match="token_mean"):
        reduce_loss(LOSS, MASK, "tokenmean", batch_tokens=4, batch_sequences=2)
