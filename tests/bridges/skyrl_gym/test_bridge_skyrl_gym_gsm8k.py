"""gsm8k and gsm8k_multi_turn through the bridge, on the bridge's built-in rows (offline, no files).

Findings about the peer pinned here: gsm8k_multi_turn pays 0.2/max_turns for every well-formatted wrong
answer and they add up, so its best episode (1.16 at 5 turns) stalls with wrong answers before the right one;
the adversarial checker's ``replay`` probe flags it, and declaring the natural range (0, 1) fails check_env.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_core.factory import env_class
from skyrl_core.testing import check_adversarial, check_env

MULTI = {"name": "gsm8k_multi_turn"}


def make(options=None, split="train", row=0):
    cls = env_class("skyrl_gym")
    config = SkyRLGymConfig(**(options or {}))
    task = cls.load_dataset(split, config)[row]
    return cls(task=task, config=config)


def play(env, actions, seed=0):
    env.reset(seed=seed)
    rewards = []
    for action in actions:
        step = env.step(action)
        rewards.append(step.reward)
        if step.terminated or step.truncated:
            break
    return rewards


def test_gsm8k_passes_check_env_on_its_built_in_rows():
    report = check_env("skyrl_gym", n_tasks=0)
    assert not report.failed and "gold[row 6]" in report.passed and "spec" in report.passed


def test_gsm8k_multi_turn_passes_check_env_with_its_honest_range():
    report = check_env("skyrl_gym", config=MULTI, n_tasks=2)
    assert not report.failed and "episode:formatted_wrong_then_gold" in report.passed


def test_the_peer_pays_the_first_strict_answer_only():
    env = make()
    assert env.gold_actions() == ["#### 54"]
    assert play(env, ["So the answer is #### 54"]) == [1.0]
    assert play(env, ["#### 53\n#### 54"]) == [0.0]  # a hedge: the first '#### N' counts
    assert play(env, ["#### 54."]) == [0.0]  # a finding: a full stop after the number makes a right answer wrong
    assert play(env, ["The answer is 54."]) == [0.0]  # no '#### ': strict


def test_multi_turn_format_bonuses_add_up_over_turns():
    env = make(MULTI)
    assert env.max_turns == 5 and env.reward_range[1] == pytest.approx(1.16)
    assert play(env, ["#### 54"]) == [1.0]  # right at once: 1.0, below what stalling earns
    stalled = play(env, env.gold_actions())
    assert stalled == pytest.approx([0.04, 0.04, 0.04, 0.04, 1.0]) and sum(stalled) == pytest.approx(1.16)
    assert sum(play(env, ["#### 1"] * 5)) == pytest.approx(0.2)  # never right, still paid


def test_the_natural_range_is_caught_by_check_env():
    report = check_env("skyrl_gym", config={**MULTI, "reward_range": (0.0, 1.0)}, n_tasks=1, raise_on_failure=False)
    assert any(failure.startswith("gold[row 1]") and "1.16" in failure for failure in report.failed), report.failed


def test_adversarial_quick_finds_nothing_on_gsm8k_and_the_full_run_flags_replay_on_multi_turn():
    assert check_adversarial("skyrl_gym", quick=True).ok
    assert check_adversarial("skyrl_gym", config=MULTI, quick=True).ok
    full = check_adversarial("skyrl_gym", config=MULTI)
    assert {outcome.probe for outcome in full.flagged} == {"replay"}, full.problems()
    assert "scored 0.2, above an honest wrong answer's 0.04" in full.problems()[0]
    assert check_adversarial("skyrl_gym").ok  # single-turn gsm8k: every generic probe


def test_a_rejected_reply_reaches_the_peer_which_scores_it_as_no_answer():
    env = make(MULTI)
    env.reset(seed=0)
    step = env.step("   ")
    assert step.info["invalid_action"].startswith("Your response was empty")
    assert step.reward == 0.0 and not step.terminated
    assert env._peer.turns == 1  # the peer counted the turn: its turn-limit stays in step with ours
    assert "four hash" not in step.observation[0]["content"] and "'#### ANSWER'" in step.observation[0]["content"]
    for _ in range(3):
        env.step("x" * (env.config.max_action_chars + 1))
    last = env.step("")
    assert last.terminated and env._peer.turns == 5


def test_the_process_rng_is_untouched_and_a_seed_repeats_the_episode():
    random.seed(123)
    np.random.seed(123)
    before = random.getstate(), np.random.get_state()[1].copy()
    env = make(MULTI)
    runs = []
    for _ in range(2):
        prompt, _ = env.reset(seed=7)
        runs.append((prompt, [tuple(env.step(a)[:4]) for a in ["#### 1", "", "#### 54"]]))
    assert runs[0] == runs[1]
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()


def test_a_row_for_another_env_is_refused_by_name():
    env = make()
    good = dict(env.task)
    with pytest.raises(ValueError, match="env_class is 'text2sql' but env.name is 'gsm8k'"):
        env.reset(options={"task": {**good, "env_class": "text2sql"}})
    with pytest.raises(ValueError, match="no 'reward_spec.ground_truth'"):
        env.reset(options={"task": {**good, "reward_spec": {}}})


def test_a_ground_truth_the_peer_cannot_parse_has_no_gold_and_a_zero_ceiling():
    env = make()
    env.reset(options={"task": {**env.task, "reward_spec": {"ground_truth": "1,000"}}})
    assert env.gold_actions() is None and env.reward_ceiling() == 0.0
    assert play(env, ["#### 1,000"]) == [0.0]  # the peer drops the comma, then compares with '1,000'
