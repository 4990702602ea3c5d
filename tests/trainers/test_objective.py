"""The gradient of a step does not depend on how its samples are split into micro-batches."""

import pytest
import torch
from skyrl_trainers import prompt_cache
from skyrl_trainers.batching import TrainSample, plan_step
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.forward import collate
from skyrl_trainers.models import build_tiny_random
from skyrl_trainers.objective import Normalisers, micro_batch_loss
from skyrl_trainers.prompt_cache import PromptCache


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


def gradient(model, cfg, budget, shared_prompts=False, carry=False, batch=None, skip=False):
    model.zero_grad(set_to_none=True)
    batch = batch or samples(shared_prompts)
    [[plan]] = plan_step(batch, world_size=1, mini_batches=1, micro_batch_tokens=budget, carried_prompts=carry,
                         skip_zero_advantage=skip)
    prompts = PromptCache()
    for micro in plan.micro_batches:
        loss, _ = micro_batch_loss(cfg, model, collate(micro, carry_prompts=carry),
                                   Normalisers(plan.batch_tokens, plan.batch_sequences), prompts=prompts)
        loss.backward()
    prompts.backward(model)
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


def group_of_eight(prompt_lengths=(9, 1, 6)):
    """Groups of 8 samples (varied response lengths) after prompts of ``prompt_lengths`` tokens."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for prompt_length in prompt_lengths:
        prompt = torch.randint(10, 500, (prompt_length,), generator=generator).tolist()
        for i in range(8):
            response = torch.randint(10, 500, (2 + 3 * i % 7,), generator=generator).tolist()
            mask = [1] * len(response)
            mask[len(response) // 2] = 0
            out.append(TrainSample(prompt + response, prompt_length, mask, [-2.0] * len(response), (-1) ** i * (1 + i / 8)))
    return out


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean"])
def test_carrying_prompts_over_micro_batches_keeps_the_gradient_and_runs_each_prompt_once(reduction):
    """Three groups of 8 over micro-batches of about two samples: rows then hold one prompt token each
    (a 1-token prompt carries nothing), and the weights' gradient is the one of prompts in every row."""
    model, _ = build_tiny_random()
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random", loss_reduction=reduction, entropy_coef=0.01)
    batch = group_of_eight()
    in_rows_count, in_rows = gradient(model, cfg, budget=24, batch=batch)
    carried_count, carried = gradient(model, cfg, budget=24, carry=True, batch=batch)
    assert in_rows.abs().max() > 0
    torch.testing.assert_close(carried, in_rows, rtol=1e-4, atol=1e-5 * float(in_rows.abs().max()))
    # the planner counts one prompt token a row, so the same samples fill fewer micro-batches
    assert carried_count < in_rows_count
    [[plan]] = plan_step(batch, world_size=1, mini_batches=1, micro_batch_tokens=24, carried_prompts=True)
    rows = [collate(micro, carry_prompts=True) for micro in plan.micro_batches]
    responses = sum(len(s.input_ids) - s.response_start for s in batch)
    assert sum(int((r.input_ids != 0).sum()) for r in rows) <= responses + sum(r.input_ids.shape[0] for r in rows)
    assert all(len(p) in (8, 0, 5) for r in rows for p in r.carried_prompts)


def with_flat_groups(batch):
    """``batch`` (groups of 8) with its second group's advantages 0 (all rewards equal) and one more 0."""
    return [TrainSample(s.input_ids, s.response_start, s.loss_mask, s.rollout_logprobs,
                        0.0 if 8 <= i < 16 or i == 3 else s.advantage) for i, s in enumerate(batch)]


@pytest.mark.parametrize("carry", [False, True])
@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "sequence_mean_token_sum"])
@pytest.mark.parametrize("policy_loss", ["ppo_clip", "dual_clip", "gspo"])
def test_skipping_zero_advantage_samples_keeps_the_gradient(policy_loss, reduction, carry):
    model, _ = build_tiny_random()
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random", loss_reduction=reduction, policy_loss=policy_loss, loss_norm=8.0)
    batch = with_flat_groups(group_of_eight((9, 4, 6)))
    all_count, everything = gradient(model, cfg, budget=24, carry=carry, batch=batch)
    skip_count, skipped = gradient(model, cfg, budget=24, carry=carry, batch=batch, skip=True)
    assert everything.abs().max() > 0 and skip_count < all_count
    torch.testing.assert_close(skipped, everything, rtol=1e-4, atol=1e-5 * float(everything.abs().max()))
    [[plan]] = plan_step(batch, world_size=1, mini_batches=1, micro_batch_tokens=24, skip_zero_advantage=True)
    assert sorted(id(s) for s in plan.samples) == sorted(id(s) for s in batch if s.advantage != 0)
    assert (plan.batch_tokens, plan.batch_sequences) == (sum(s.num_tokens for s in batch), len(batch))


def test_an_entropy_bonus_makes_zero_advantage_samples_count():
    """Guards the trainer's rule (skip only without entropy or KL terms): their entropy has a gradient."""
    model, _ = build_tiny_random()
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random", entropy_coef=0.01)
    batch = with_flat_groups(group_of_eight((9, 4, 6)))
    _, everything = gradient(model, cfg, budget=24, batch=batch)
    _, skipped = gradient(model, cfg, budget=24, batch=batch, skip=True)
    assert not torch.allclose(skipped, everything, rtol=1e-3)


class PromptsInGraph(PromptCache):
    """The reference for dropout: each prompt's keys and values keep their graph, so every micro-batch's
    backward goes straight through the prompt run whose masks its forward used."""

    def _states_of(self, model, prompt):
        key = (id(model), prompt)
        if key not in self._states:
            self._states[key] = prompt_cache._prompt_states(model, prompt, self.device)
        return self._states[key]

    def backward(self, model):
        pass


def test_carried_prompts_under_dropout_get_the_gradient_of_the_masks_their_forward_used():
    """The prompt runs again for its gradient; under dropout it must draw the masks of its first run."""
    model, _ = build_tiny_random()
    model.config.attention_dropout = 0.3
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.3
    model.train()
    cfg = FSDPGRPOConfig(model="tiny-random")
    batch = group_of_eight()
    [[plan]] = plan_step(batch, world_size=1, mini_batches=1, micro_batch_tokens=24, carried_prompts=True)
    grads = []
    for cache in (PromptCache(), PromptsInGraph()):
        torch.manual_seed(3)
        model.zero_grad(set_to_none=True)
        for micro in plan.micro_batches:
            loss, _ = micro_batch_loss(cfg, model, collate(micro, carry_prompts=True),
                                       Normalisers(plan.batch_tokens, plan.batch_sequences), prompts=cache)
            loss.backward(retain_graph=isinstance(cache, PromptsInGraph))
        cache.backward(model)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    carried, in_graph = grads
    torch.testing.assert_close(carried, in_graph, rtol=1e-4, atol=1e-5 * float(in_graph.abs().max()))


def test_carried_prompts_need_their_cache():
    model, _ = build_tiny_random()
    cfg = FSDPGRPOConfig(model="tiny-random")
    batch = collate(group_of_eight()[:2], carry_prompts=True)
    with pytest.raises(ValueError, match="carry their prompts"):
        micro_batch_loss(cfg, model, batch, Normalisers(4, 2))
    # eager attention would never read the carried keys: an error, not a silently different loss
    model.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="need sdpa attention, not 'eager'"):
        micro_batch_loss(cfg, model, batch, Normalisers(4, 2), prompts=PromptCache())


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
