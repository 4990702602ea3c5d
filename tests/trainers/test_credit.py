"""Advantages for plain groups, step-wise episodes, rollout trees and failed episodes."""

import pytest
from skyrl_core.trajectory import Trajectory
from skyrl_trainers.credit import assign_advantages

Z = 0.707107  # GRPO z-score of 1 and 0 in a group of two: +-0.5 / std(1, 0) = +-0.5 / 0.7071


def traj(id, group="g", sample=0, reward=0.0, **kw):
    kw.setdefault("loss_mask", [1, 1])
    return Trajectory(id=id, group_id=group, sample_index=sample, reward=reward, **kw)


def test_groups_are_normalised_separately():
    batch = [traj("a", "g1", 0, 1.0), traj("b", "g1", 1, 0.0), traj("c", "g2", 0, 5.0), traj("d", "g2", 1, 5.0)]
    assert assign_advantages(batch) == pytest.approx([Z, -Z, 0.0, 0.0], abs=1e-5)


def test_step_wise_uses_last_step_reward_and_broadcasts_to_every_step():
    # episode e1 (3 steps) ends with reward 1; e2 (1 step) with 0. Earlier steps carry misleading rewards.
    batch = [
        traj("e1-s0", sample=0, reward=-9.0, step_index=0, is_last_step=False),
        traj("e1-s1", sample=0, reward=-9.0, step_index=1, is_last_step=False),
        traj("e1-s2", sample=0, reward=1.0, step_index=2, is_last_step=True),
        traj("e2-s0", sample=1, reward=0.0, step_index=0, is_last_step=True),
    ]
    assert assign_advantages(batch) == pytest.approx([Z, Z, Z, -Z], abs=1e-5)


def test_step_wise_steps_without_generated_tokens_do_not_break_the_episode():
    batch = [traj("e1-s0", sample=0, reward=1.0, step_index=0, is_last_step=False, loss_mask=[0]),
             traj("e1-s1", sample=0, reward=1.0, step_index=1, is_last_step=True),
             traj("e2-s0", sample=1, reward=0.0, step_index=0, is_last_step=True)]
    assert assign_advantages(batch) == pytest.approx([Z, Z, -Z], abs=1e-5)


def tree():
    return [traj("r1", sample=0, reward=1.0), traj("r2", sample=1, reward=0.0),
            traj("c1", sample=0, reward=0.0, parent_id="r1", depth=1),
            traj("c2", sample=1, reward=1.0, parent_id="r2", depth=1),
            traj("gc", sample=1, reward=1.0, parent_id="c2", depth=2)]


def test_tree_children_inherit_their_roots_advantage_by_default():
    assert assign_advantages(tree()) == pytest.approx([Z, -Z, Z, -Z, -Z], abs=1e-5)


def test_tree_children_own_advantage_is_grouped_by_task_and_depth():
    out = assign_advantages(tree(), child_advantage="own")
    # depth 1: rewards (0, 1) -> (-Z, Z); depth 2: a group of one keeps its raw score
    assert out == pytest.approx([Z, -Z, -Z, Z, 1.0], abs=1e-5)


def test_tree_children_can_be_excluded():
    assert assign_advantages(tree(), child_advantage="exclude")[2:] == [None, None, None]


def test_failed_episodes_are_not_trained_and_not_in_the_baseline():
    batch = [traj("a", sample=0, reward=1.0), traj("b", sample=1, reward=0.0),
             traj("c", sample=2, reward=0.0, error="TimeoutError: sandbox"),
             traj("d", sample=3, reward=0.0, loss_mask=[])]
    out = assign_advantages(batch)
    assert out[:2] == pytest.approx([Z, -Z], abs=1e-5)  # the baseline is mean(1, 0), not mean(1, 0, 0, 0)
    assert out[2:] == [None, None]


def test_a_failed_step_excludes_its_whole_episode():
    batch = [traj("e1-s0", sample=0, step_index=0, is_last_step=False),
             traj("e1-s1", sample=0, reward=1.0, step_index=1, is_last_step=True, error="boom"),
             traj("e2-s0", sample=1, reward=1.0, step_index=0, is_last_step=True)]
    assert assign_advantages(batch) == [None, None, pytest.approx(1.0)]


def test_rloo_estimator_is_selectable():
    batch = [traj("a", sample=0, reward=1.0), traj("b", sample=1, reward=0.0), traj("c", sample=2, reward=0.0)]
    assert assign_advantages(batch, estimator="rloo") == pytest.approx([1.0, -0.5, -0.5])


def test_reinforce_pp_whitens_over_the_tokens_of_each_episode():
    # episode a: 1 token, reward 1; episode b: two steps of 1 + 2 tokens, reward 0 -> as in the
    # hand-computed algorithm test: mean 0.25, std 0.5
    batch = [traj("a", sample=0, reward=1.0, loss_mask=[1]),
             traj("b-s0", sample=1, step_index=0, is_last_step=False, loss_mask=[1]),
             traj("b-s1", sample=1, reward=0.0, step_index=1, is_last_step=True, loss_mask=[1, 1, 0])]
    assert assign_advantages(batch, estimator="reinforce_pp") == pytest.approx([1.5, -0.5, -0.5], abs=1e-4)
