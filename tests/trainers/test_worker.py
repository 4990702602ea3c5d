"""A trainer rank: updates move the weights, checkpoints restore model, optimizer, scheduler and RNG exactly."""

import pytest
import torch
from skyrl_trainers.batching import TrainSample, plan_step
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.worker import WorkerSpec
from skyrl_trainers.workers import LocalWorkerGroup


def plan(seed):
    generator = torch.Generator().manual_seed(seed)
    batch = [TrainSample(torch.randint(10, 500, (9,), generator=generator).tolist(), 4, [1] * 5, [-3.0] * 5, a)
             for a in (1.0, -1.0, 0.5)]
    return plan_step(batch, world_size=1, mini_batches=1, micro_batch_tokens=1000)


@pytest.fixture
def spec():
    return WorkerSpec(FSDPGRPOConfig(model="tiny-random", lr=1e-2, warmup_steps=3, kl_coef=0.05), seed=0)


def test_checkpoint_resume_continues_exactly(spec, tmp_path):
    group = LocalWorkerGroup(spec)
    try:
        initial = {k: v.clone() for k, v in group.call("full_state_dict")[0].items()}
        group.call("train_step", per_rank=plan(1))
        group.call("save_checkpoint", str(tmp_path))
        second = group.call("train_step", per_rank=plan(2))[0]
        expected = {k: v.clone() for k, v in group.call("full_state_dict")[0].items()}
    finally:
        group.close()
    assert any(not torch.equal(initial[k], expected[k]) for k in initial)

    resumed = LocalWorkerGroup(spec)
    try:
        resumed.call("load_checkpoint", str(tmp_path))
        again = resumed.call("train_step", per_rank=plan(2))[0]
        actual = resumed.call("full_state_dict")[0]
    finally:
        resumed.close()
    # same lr from the warm-up schedule, same Adam moments -> bit-identical weights
    assert again["lr_sum"] == second["lr_sum"] == pytest.approx(1e-2 * 2 / 3)
    for key in expected:
        assert torch.equal(actual[key], expected[key]), key


def test_metrics_report_kl_entropy_and_rollout_gap(spec):
    group = LocalWorkerGroup(spec)
    try:
        group.call("train_step", per_rank=plan(1))
        metrics = group.call("train_step", per_rank=plan(1))[0]
    finally:
        group.close()
    assert metrics["tokens"] == 15
    assert metrics["kl_sum"] > 0  # the policy moved away from the reference after the first update
    assert metrics["entropy_sum"] > 0 and metrics["grad_norm_sum"] > 0
    # rollout logprobs were -3.0 while the trainer computes its own: the gap is reported
    assert metrics["logprob_gap_sum"] / metrics["tokens"] > 0.1


def test_bf16_mixed_precision_trains_with_fp32_master_weights():
    group = LocalWorkerGroup(WorkerSpec(FSDPGRPOConfig(model="tiny-random", lr=1e-2, precision="bf16")))
    try:
        before = {k: v.clone() for k, v in group.call("full_state_dict")[0].items()}
        metrics = group.call("train_step", per_rank=plan(1))[0]
        after = group.call("full_state_dict")[0]
    finally:
        group.close()
    assert metrics["grad_norm_sum"] > 0 and metrics["skipped_steps"] == 0
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.slow
def test_a_failing_spawned_rank_reports_its_traceback_instead_of_hanging(tmp_path):
    from skyrl_trainers.workers import ProcessWorkerGroup, WorkerError

    missing = str(tmp_path / "no-such-model")
    with pytest.raises(WorkerError, match=r"(?s)trainer rank \d failed during startup.*ModelLoadError.*does not exist"):
        ProcessWorkerGroup(WorkerSpec(FSDPGRPOConfig(model=missing)), world_size=2)
