"""Planning mini-batches, ranks and token-budgeted micro-batches; collating them into tensors."""

import pytest
import torch
from skyrl_core.trajectory import Trajectory
from skyrl_trainers.batching import TrainSample, plan_step, training_samples
from skyrl_trainers.forward import collate, token_logprobs
from skyrl_trainers.models import build_tiny_random


def sample(prompt, response, advantage=1.0):
    return TrainSample(list(range(1, prompt + response + 1)), prompt, [1] * response, [-0.5] * response, advantage)


def test_micro_batches_respect_the_token_budget_and_keep_every_sample():
    samples = [sample(4, n) for n in (2, 8, 3, 5, 1)]  # one prompt: packed rows share it
    [[plan]] = plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=20)
    for micro in plan.micro_batches:
        assert collate(micro).num_positions <= 20 or len(micro) == 1
    assert sorted(id(s) for m in plan.micro_batches for s in m) == sorted(id(s) for s in samples)
    assert plan.batch_tokens == 2 + 8 + 3 + 5 + 1 and plan.batch_sequences == 5
    # 4 + 2 + 8 + 3 + 5 + 1 = 23 positions packed: two micro-batches, where 5 unpacked rows need 5 or more
    assert len(plan.micro_batches) == 2


def test_samples_of_different_prompts_are_budgeted_by_padded_rows():
    samples = [TrainSample([p] * 4 + [9] * n, 4, [1] * n, [-0.5] * n, 1.0) for p, n in enumerate((2, 8, 3, 5, 1))]
    [[plan]] = plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=20)
    for micro in plan.micro_batches:
        batch = collate(micro)
        assert batch.input_ids.shape[0] == len(micro)  # no prompt in common: a row each
        assert batch.num_positions <= 20 or len(micro) == 1


def test_ranks_get_equal_micro_batch_counts_and_shared_normalisers():
    samples = [sample(3, 30)] + [sample(3, 2) for _ in range(3)]
    plans = plan_step(samples, world_size=2, mini_batches=1, micro_batch_tokens=10)
    counts = [len(p[0].micro_batches) for p in plans]
    assert counts[0] == counts[1]
    assert [p[0].batch_tokens for p in plans] == [36, 36]
    assert sum(len(m) for p in plans for m in p[0].micro_batches) == 4


def test_a_mini_batch_without_signal_runs_all_its_samples():
    """Skipping needs one sample of signal: otherwise the optimizer step (momentum, weight decay) would
    lose its zero gradient and change; the normalisers always count every sample."""
    signal = [sample(2, 3, 0.0), sample(2, 4, 1.0), sample(2, 2, 0.0), sample(2, 5, -1.0)]
    flat = [sample(3, 3, 0.0) for _ in range(3)]
    plans = plan_step(signal + flat, world_size=1, mini_batches=2, micro_batch_tokens=100, skip_zero_advantage=True)
    with_signal, without = plans[0]
    assert sorted(s.advantage for s in with_signal.samples) == [-1.0, 1.0]
    assert (with_signal.batch_tokens, with_signal.batch_sequences) == (14, 4)
    assert len(without.samples) == 3 and (without.batch_tokens, without.batch_sequences) == (9, 3)
    # without the option every sample runs
    assert sum(len(p.samples) for p in plan_step(signal + flat, world_size=1, mini_batches=2,
                                                     micro_batch_tokens=100)[0]) == 7


def test_mini_batches_split_the_step_into_optimizer_steps():
    plans = plan_step([sample(2, 2) for _ in range(5)], world_size=1, mini_batches=2, micro_batch_tokens=100)
    assert [p.batch_sequences for p in plans[0]] == [3, 2]


def test_training_samples_skip_excluded_and_tokenless_trajectories():
    trajectories = [Trajectory(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 0], logprobs=[-1.0, 0.0]),
                    Trajectory(prompt_ids=[1], response_ids=[3], loss_mask=[1], logprobs=[-1.0]),
                    Trajectory(prompt_ids=[1], response_ids=[5], loss_mask=[0], logprobs=[0.0])]
    out = training_samples(trajectories, [0.5, None, 1.0])
    assert len(out) == 1
    assert out[0].input_ids == [1, 2, 3, 4] and out[0].response_start == 2 and out[0].advantage == 0.5


def test_collate_aligns_targets_predictors_and_masks():
    a = TrainSample([10, 11, 12, 13], 2, [1, 0], [-0.1, 0.0], 2.0)
    b = TrainSample([20, 21, 22, 23, 24, 25], 3, [1, 1, 1], [-0.2, -0.3, -0.4], -1.0)
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 0, 0], [20, 21, 22, 23, 24, 25]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]  # no shared row: 2D
    # column w is response token w, predicted by the position before it (flat index row * 6 + position)
    assert batch.targets.tolist() == [[12, 13, 0], [23, 24, 25]]
    assert batch.predictors[0, :2].tolist() == [1, 2] and batch.predictors[1].tolist() == [8, 9, 10]
    assert batch.mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch.rollout_logprobs[1].tolist() == pytest.approx([-0.2, -0.3, -0.4])
    assert torch.equal(batch.advantages[:, 0], torch.tensor([2.0, -1.0]))


def test_collate_packs_samples_of_one_prompt_into_one_row():
    a = TrainSample([5, 6, 7, 1, 2], 3, [1, 1], [-0.1, -0.2], 1.0)
    b = TrainSample([5, 6, 7, 3, 4, 8], 3, [1, 0, 1], [-0.3, 0.0, -0.4], -1.0)
    c = TrainSample([9, 7, 1], 2, [1], [-0.5], 0.5)
    batch = collate([a, b, c], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 2, 3, 4, 8], [9, 7, 1, 0, 0, 0, 0, 0]]
    # each response's positions continue the prompt's
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    # the first response token of a and of b is predicted by the prompt's last position (2)
    assert batch.predictors[0, :2].tolist() == [2, 3] and batch.predictors[1].tolist() == [2, 5, 6]
    assert batch.predictors[2, :1].tolist() == [8 + 1]
    assert batch.targets.tolist() == [[1, 2, 0], [3, 4, 8], [1, 0, 0]]
    allowed = batch.attention_mask[0, 0]
    assert allowed.shape == (8, 8)
    assert allowed[6].tolist() == [True, True, True, False, False, True, True, False]  # b's 2nd token: prompt + own
    assert allowed[4].tolist() == [True, True, True, True, True, False, False, False]  # a's 2nd token
    assert batch.attention_mask[1, 0, 2].tolist() == [True, True, True, False, False, False, False, False]
    assert batch.attention_mask[1, 0, 5, 5]  # a padding position sees itself only (no empty softmax)


def test_packed_rows_give_the_log_probs_and_gradient_of_one_row_per_sample():
    torch.manual_seed(0)
    model, _ = build_tiny_random()
    model.train()
    prompt = torch.randint(10, 500, (9,)).tolist()
    group = [TrainSample(prompt + torch.randint(10, 500, (n,)).tolist(), 9, [1] * n, [-1.0] * n, a)
             for n, a in ((5, 1.0), (2, -1.0), (7, 0.5), (1, -0.5))]
    other = TrainSample(torch.randint(10, 500, (6,)).tolist(), 3, [1, 1, 1], [-1.0] * 3, 2.0)
    results = []
    for pack in (True, False):
        model.zero_grad(set_to_none=True)
        batch = collate([*group, other], pack=pack)
        logp, entropy = token_logprobs(model, batch)
        (logp * batch.advantages * batch.mask).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((batch.num_positions, (logp * batch.mask).detach(), entropy * batch.mask, grad))
    (packed_positions, *packed), (plain_positions, *plain) = results
    assert packed_positions < plain_positions
    for mine, theirs in zip(packed, plain, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5 * float(theirs.abs().max()))


def test_shared_prompt_blocks_give_the_log_probs_and_gradients_of_the_4d_mask():
    """sdpa attends packed rows block by block (prompt + first sample, then each further sample against the
    prompt and itself): the numbers of the full masked attention, without its work."""
    torch.manual_seed(0)
    model, _ = build_tiny_random()
    model.train()
    samples = []
    for prompt_len, responses in ((9, (5, 2, 7, 1)), (4, (6,)), (3, (3, 8))):
        prompt = torch.randint(10, 500, (prompt_len,)).tolist()
        samples += [TrainSample(prompt + torch.randint(10, 500, (n,)).tolist(), prompt_len, [1] * n, [-1.0] * n, 1.0)
                    for n in responses]
    results = []
    for blocks in (True, False):
        model.zero_grad(set_to_none=True)
        batch = collate(samples)
        if blocks:  # the mask is not read: a mask that hides nothing gives the same numbers
            batch.attention_mask = torch.ones_like(batch.attention_mask)
        else:
            batch.shared_prompt = None
        logp, entropy = token_logprobs(model, batch, entropy_grad=True)
        weights = torch.linspace(-1, 1, logp.numel()).view_as(logp) * batch.mask
        ((logp + entropy) * weights).sum().backward()
        grads = [p.grad for p in model.parameters()]
        results.append([(logp * batch.mask).detach(), (entropy * batch.mask).detach(), *grads])
    for mine, theirs in zip(*results, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5 * max(1.0, float(theirs.abs().max())))


def test_collate_of_nothing_is_a_dummy_row_with_nothing_to_train():
    batch = collate([], pad_id=7)
    assert batch.mask.sum() == 0 and batch.input_ids.shape == (1, 2)


def test_ranks_receive_whole_groups():
    groups = [[TrainSample([g] * 5 + [9] * n, 5, [1] * n, [-0.5] * n, 1.0) for n in (3, 4)] for g in range(4)]
    plans = plan_step([s for group in groups for s in group], world_size=2, mini_batches=1, micro_batch_tokens=100)
    for rank_plan in plans:
        prompts = [s.input_ids[0] for micro in rank_plan[0].micro_batches for s in micro]
        assert all(prompts.count(p) == 2 for p in prompts)  # both samples of a group on one rank
