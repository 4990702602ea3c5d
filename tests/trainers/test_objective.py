"""The gradient of a step does not depend on how its samples are split into micro-batches."""

import pytest
import torch
from skyrl_trainers.batching import TrainSample, plan_step
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.forward import collate
from skyrl_trainers.models import build_tiny_random
from skyrl_trainers.objective import Normalisers, micro_batch_loss


def samples(shared_prompts=False):
    """Five samples; with ``shared_prompts`` the 2nd and 4th reuse the 1st's prompt (one GRPO group)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for prompt, response, advantage in [(5, 3, 1.0), (4, 9, -0.5), (7, 1, 2.0), (3, 6, -1.5), (6, 4, 0.25)]:
        ids = torch.randint(10, 500, (prompt + response,), generator=generator).tolist()
        if shared_prompts and len(out) in (1, 3):
            prompt = out[0].response_start
            ids = out[0].input_ids[:prompt] + ids[-response:]
        mask = [1] * response
        mask[response // 2] = 0  # an observation token inside the response
        out.append(TrainSample(ids, prompt, mask, [-2.0] * response, advantage))
    return out


def gradient(model, cfg, budget, shared_prompts=False):
    model.zero_grad(set_to_none=True)
    [[plan]] = plan_step(samples(shared_prompts), world_size=1, mini_batches=1, micro_batch_tokens=budget)
    for micro in plan.micro_batches:
        loss, _ = micro_batch_loss(cfg, model, collate(micro), Normalisers(plan.batch_tokens, plan.batch_sequences))
        loss.backward()
    return len(plan.micro_batches), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "sequence_mean_token_sum"])
@pytest.mark.parametrize("policy_loss", ["ppo_clip", "dual_clip", "gspo"])
def test_gradient_is_invariant_to_micro_batch_size(reduction, policy_loss):
    model, _ = build_tiny_random()
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random", loss_reduction=reduction, policy_loss=policy_loss, entropy_coef=0.01,
                         loss_norm=8.0)
    whole_count, whole = gradient(model, cfg, budget=10_000)
    split_count, split = gradient(model, cfg, budget=14)
    assert (whole_count, split_count) == (1, 5)
    assert whole.abs().max() > 0
    # float32 sums in another order differ by ~1e-6 of the largest gradient, whatever the CPU's kernels
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-5 * float(whole.abs().max()))


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
def test_packing_a_group_into_shared_prompt_rows_keeps_the_gradient(reduction):
    model, _ = build_tiny_random()
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random", loss_reduction=reduction, entropy_coef=0.01)
    # one micro-batch (the group in one packed row) against one row per micro-batch
    whole_count, whole = gradient(model, cfg, budget=10_000, shared_prompts=True)
    split_count, split = gradient(model, cfg, budget=1, shared_prompts=True)
    assert (whole_count, split_count) == (1, 5)
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=1e-5 * float(whole.abs().max()))


def test_per_micro_batch_mean_would_not_be_invariant():
    """Guards the test above: a naive per-micro-batch token mean changes the gradient."""
    model, _ = build_tiny_random()
    cfg = FSDPGRPOConfig(model="tiny-random")
    _, whole = gradient(model, cfg, budget=10_000)
    model.zero_grad(set_to_none=True)
    [[plan]] = plan_step(samples(), world_size=1, mini_batches=1, micro_batch_tokens=14)
    for micro in plan.micro_batches:
        tokens = sum(s.num_tokens for s in micro)
        loss, _ = micro_batch_loss(cfg, model, collate(micro), Normalisers(tokens, len(micro)))
        loss.backward()
    naive = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert not torch.allclose(naive, whole, rtol=1e-3)
