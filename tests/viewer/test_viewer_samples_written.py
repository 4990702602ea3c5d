"""What ``fsdp_grpo`` stores for the viewer: sampled roots with their whole trees, parent links, advantages."""

from __future__ import annotations

import pytest
from skyrl_core.trajectory import Trajectory, read_jsonl

samples = pytest.importorskip("skyrl_trainers.samples")
credit = pytest.importorskip("skyrl_trainers.credit")


def episode(id_: str, group: str, reward: float, parent: Trajectory | None = None, **fields) -> Trajectory:
    return Trajectory(id=id_, group_id=group, reward=reward, parent_id=parent.id if parent else None,
                      depth=parent.depth + 1 if parent else 0, response_ids=[1, 2], loss_mask=[1, 1],
                      logprobs=[-0.1, -0.2], **fields)


def write(tmp_path, trajectories: list[Trajectory], samples_per_step: int) -> list[Trajectory]:
    advantages = credit.assign_advantages(trajectories)  # the trainer's defaults: grpo, child_advantage=inherit
    samples.write_samples(tmp_path / "samples.jsonl", 7, trajectories, advantages, samples_per_step)
    return list(read_jsonl(tmp_path / "samples.jsonl")) if (tmp_path / "samples.jsonl").exists() else []


def test_sampled_roots_come_with_their_trees_depth_first(tmp_path):
    roots = [episode(f"r{i}", f"g{i // 2}", float(i % 2)) for i in range(4)]
    c0, c1 = episode("c0", "g0", 1.0, roots[0]), episode("c1", "g0", 0.0, roots[0])
    grandchild = episode("gc", "g0", 0.5, c0)
    other = episode("c2", "g1", 1.0, roots[2])
    batch = [*roots, c0, c1, grandchild, other]  # the generator's order: children after all roots
    stored = write(tmp_path, batch, samples_per_step=2)
    assert [t.id for t in stored] == ["r0", "c0", "gc", "c1", "r2", "c2"]
    assert [t.parent_id for t in stored] == [None, "r0", "c0", "r0", None, "r2"]
    assert all(t.metrics["train_step"] == 7.0 for t in stored)
    assert stored[0].metrics["advantage"] < 0  # r0 (reward 0) lost to r1 (reward 1) in group g0
    assert stored[1].metrics["advantage"] == stored[0].metrics["advantage"]  # child_advantage=inherit


def test_no_samples_when_off_and_plain_batches_keep_their_spread(tmp_path):
    batch = [episode(f"r{i}", f"g{i}", 0.0) for i in range(8)]
    assert write(tmp_path, batch, samples_per_step=0) == []
    assert [t.id for t in write(tmp_path, batch, samples_per_step=4)] == ["r0", "r2", "r4", "r6"]


def test_step_wise_episodes_are_stored_whole(tmp_path):
    steps = [episode(f"e{i}-s{k}", "g", 1.0, step_index=k, is_last_step=k == 1) for i in range(2) for k in range(2)]
    child = episode("k-s0", "g", 1.0, step_index=0)
    child.parent_id, child.depth = "e0", 1  # a child points at its parent episode, not at one step
    stored = write(tmp_path, [*steps, child], samples_per_step=1)
    assert [t.id for t in stored] == ["e0-s0", "e0-s1", "k-s0"]
