"""Planning mini-batches, ranks and token-budgeted micro-batches; collating them into tensors."""

import pytest
import torch
from skyrl_core.trajectory import Trajectory
from skyrl_trainers.batching import TrainSample, plan_step, training_samples
from skyrl_trainers.forward import collate


def sample(prompt, response, advantage=1.0):
    return TrainSample(list(range(1, prompt + response + 1)), prompt, [1] * response, [-0.5] * response, advantage)


def test_micro_batches_respect_the_token_budget_and_keep_every_sample():
    samples = [sample(4, n) for n in (2, 8, 3, 5, 1)]
    [[plan]] = plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=20)
    for micro in plan.micro_batches:
        assert len(micro) * max(len(s.input_ids) for s in micro) <= 20 or len(micro) == 1
    assert sorted(id(s) for m in plan.micro_batches for s in m) == sorted(id(s) for s in samples)
    assert plan.batch_tokens == 2 + 8 + 3 + 5 + 1 and plan.batch_sequences == 5


def test_ranks_get_equal_micro_batch_counts_and_shared_normalisers():
    samples = [sample(3, 30)] + [sample(3, 2) for _ in range(3)]
    plans = plan_step(samples, world_size=2, mini_batches=1, micro_batch_tokens=10)
    counts = [len(p[0].micro_batches) for p in plans]
    assert counts[0] == counts[1]
    assert [p[0].batch_tokens for p in plans] == [36, 36]
    assert sum(len(m) for p in plans for m in p[0].micro_batches) == 4


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


def test_collate_aligns_masks_with_predicted_tokens():
    a = TrainSample([10, 11, 12, 13], 2, [1, 0], [-0.1, 0.0], 2.0)
    b = TrainSample([20, 21, 22, 23, 24, 25], 3, [1, 1, 1], [-0.2, -0.3, -0.4], -1.0)
    batch = collate([a, b], pad_id=0)
    # logits start at position offset = 1 (the token before a's response), predicting input_ids[:, 2:]
    assert batch.offset == 1
    assert batch.input_ids[:, 2:].tolist() == [[12, 13, 0, 0], [22, 23, 24, 25]]
    assert batch.mask.tolist() == [[1, 0, 0, 0], [0, 1, 1, 1]]
    assert batch.rollout_logprobs[1].tolist() == pytest.approx([0.0, -0.2, -0.3, -0.4])
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert torch.equal(batch.advantages[:, 0], torch.tensor([2.0, -1.0]))


def test_collate_of_nothing_is_a_dummy_row_with_nothing_to_train():
    batch = collate([], pad_id=7)
    assert batch.mask.sum() == 0 and batch.input_ids.shape == (1, 2)
