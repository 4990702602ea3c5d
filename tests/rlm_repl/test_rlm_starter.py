"""The starter curriculum and the main job's shaping: short-context tasks, the short prompt with a worked
example, and format rewards paid once, only for what the model's own code did, beside the task reward."""

from __future__ import annotations

import pytest
from rlm_helpers import repl
from skyrl_core.factory import ConfigError, validate_config
from skyrl_core.plugins import get_plugin_manager
from skyrl_rlm_repl.config import RLMReplConfig
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_rlm_repl.evidence.dataset import load_tasks
from skyrl_rlm_repl.starter import KINDS, solve, starter_tasks

SHAPED = {"format_reward": {"block_runs": 0.1, "final_called": 0.1}}


def starter_row(kind: str = "total") -> dict:
    return next(row for row in starter_tasks("starter") if row["kind"] == kind)


def test_starter_splits_are_fixed_balanced_and_answered_by_their_solution():
    train, test = starter_tasks("starter"), starter_tasks("starter_test")
    assert (len(train), len(test)) == (240, 60) and starter_tasks("starter") == train  # same rows every time
    assert {row["kind"] for row in train} == {kind.name for kind in KINDS}
    assert all(row["answer"] == solve(row["solution"], row["context"]) for row in train + test)
    assert {row["id"] for row in train}.isdisjoint(row["id"] for row in test)
    assert RLMReplEnv.load_dataset("starter_test") == test
    with pytest.raises(ValueError, match="unknown starter split 'starter_dev'"):
        starter_tasks("starter_dev")


def test_starter_rows_get_the_short_prompt_and_evidence_rows_the_full_one(make_env):
    short = make_env(task=starter_row(), worked_example=True).build_prompt()
    assert [m["role"] for m in short] == ["system", "user", "assistant", "user"]
    assert "```repl" in short[2]["content"] and "FINAL(" in short[2]["content"]
    assert short[-1]["content"] == starter_row()["question"] and "a list of" in short[0]["content"]
    assert len(short[0]["content"]) < 400 and "llm_query" not in short[0]["content"]
    evidence = make_env(task=load_tasks(split="train")[0]).build_prompt()
    assert [m["role"] for m in evidence] == ["system", "user"] and "list_papers()" in evidence[0]["content"]
    forced = make_env(task=starter_row(), prompt_style="full").build_prompt()
    assert "llm_query" in forced[0]["content"] and len(forced) == 2


def test_a_right_answer_from_a_running_block_earns_the_full_reward(make_env):
    env = make_env(task=starter_row("total"), **SHAPED)
    result = env.step(repl("FINAL(sum(context))"))
    assert result.terminated and result.reward == pytest.approx(1.0)
    assert result.info["reward_components"]["task_reward"] == 1.0
    assert env.get_metrics()["task_reward"] == 1.0 and env.get_metrics()["format_reward"] == pytest.approx(0.2)


def test_format_rewards_rank_wrong_answers_below_right_ones_and_are_paid_once(make_env):
    env = make_env(task=starter_row("total"), **SHAPED)
    first = env.step(repl("x = 1") + "\n" + repl("y = 2"))  # two clean blocks: one bonus
    second = env.step(repl("print(x)"))  # another clean block in a later turn: nothing more
    last = env.step(repl("FINAL(max(context))"))  # wrong answer, submitted from a running block
    assert (first.reward, second.reward) == (pytest.approx(0.1), 0.0)
    assert last.terminated and last.reward == pytest.approx(0.1)
    assert first.reward + second.reward + last.reward == pytest.approx(0.2)
    assert env.get_metrics()["task_reward"] == 0.0


def test_blocks_that_fail_and_text_answers_earn_no_block_bonus(make_env):
    env = make_env(task=starter_row("total"), **SHAPED)
    failing = env.step(repl("context.split()"))  # AttributeError on a list
    assert "AttributeError" in failing.observation[0]["content"] and failing.reward == 0.0
    answer = env.step("FINAL(12)")  # a text line: final bonus only
    assert answer.terminated and answer.reward == pytest.approx(0.1)
    assert env.get_metrics()["format_reward"] == pytest.approx(0.1)


def test_without_shaping_the_reward_is_the_task_reward(make_env):
    env = make_env(task=starter_row("total"))
    assert env.step(repl("x = 1")).reward == 0.0
    assert env.step(repl("FINAL(min(context))")).reward == 0.0
    row = starter_row("largest")
    assert make_env(task=row).step(f"FINAL({row['answer']})").reward == 1.0


def test_shaping_may_not_outweigh_the_task():
    with pytest.raises(ConfigError, match="at most 0.5"):
        validate_config(RLMReplConfig, {"format_reward": {"block_runs": 0.3, "final_called": 0.3}}, "env")


def test_the_main_job_trains_on_the_starter_curriculum_with_shaping():
    from skyrl_core.config import build_config, env_run_defaults

    registry = get_plugin_manager().registry
    layers = [{"env": {"id": "rlm_repl"}, "trainer": {"id": "fsdp_grpo"}}, {"trainer": {"steps": 3}}]
    cfg = build_config(env_run_defaults(layers, registry), *layers, registry=registry)
    assert cfg.trainer.data_split == "starter" and cfg.trainer.steps == 3  # the user's override wins
    assert cfg.env.worked_example and cfg.env.format_reward.block_runs == 0.1 and cfg.env.max_turns == 2
    assert cfg.generator_id == "rlm_tree" and cfg.generator.temperature == 0.7
    # unshuffled, any three consecutive steps of batch_size tasks cover every kind once
    kinds = [row["kind"] for row in starter_tasks("starter")]
    per_window = 3 * cfg.trainer.batch_size
    assert not cfg.trainer.shuffle and per_window == len(KINDS)
    assert all(sorted(kinds[i:i + per_window]) == sorted(k.name for k in KINDS) for i in range(240 - per_window + 1))
