"""Every built-in task is solvable and not free: its oracle scores exactly 1, an agent that does nothing scores 0.

Docker runs every task; bwrap runs those whose task.toml declares ``base_packages_only = true`` and not
``tests_run_agent_code = true``.
Parametrized by task name, so a broken task is named by the failing test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tomllib
from harbor_helpers import bash, builtin_row
from skyrl_core import StepResult
from skyrl_harbor_terminal.env import BUILTIN_TASKS, HarborTerminalEnv

TASKS = sorted(path.name for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())


def skyrl_flags(name: str) -> dict:
    return tomllib.loads((BUILTIN_TASKS / name / "task.toml").read_text()).get("metadata", {}).get("skyrl", {})


BASE_ONLY = [name for name in TASKS
             if skyrl_flags(name).get("base_packages_only") is True and not skyrl_flags(name).get("tests_run_agent_code")]
MULTI_STEP = "word-counter-project"  # its second step's tests run the agent's script: Docker only


def play_oracle(name: str, backend: str) -> tuple[float, dict]:
    row = builtin_row(name)
    env = HarborTerminalEnv(task=row, config={"backend": backend})
    try:
        env.reset(options={"task": row})
        gold = env.gold_actions()
        assert gold, f"{name} has no oracle"
        total = 0.0
        for action in gold:
            result = env.step(action)
            assert "error" not in result.info, result.info["error"]
            total += result.reward
            if result.terminated or result.truncated:
                break
        assert result.terminated and not result.truncated, result.info
        if total != 1.0:  # name the failing step and what its tests said
            result.info["verdicts"] = [(v.reward, v.problem, v.output_tail[-500:]) for v in env.verdicts]
        return total, result.info
    finally:
        env.close()


def play_nothing(name: str, backend: str) -> tuple[float, dict]:
    """Looks around, then claims to be done on every step."""
    row = builtin_row(name)
    env = HarborTerminalEnv(task=row, config={"backend": backend})
    try:
        env.reset(options={"task": row})
        result = env.step(bash("ls -la"))
        total = result.reward
        while not (result.terminated or result.truncated):
            result = env.step("<done/>")
            total += result.reward
        assert "error" not in result.info, result.info["error"]
        return total, result.info
    finally:
        env.close()


def test_the_task_lists_are_what_the_tests_expect() -> None:
    assert len(TASKS) == 18 and MULTI_STEP in TASKS and "notes-digest" in BASE_ONLY
    assert set(BASE_ONLY) <= set(TASKS) and len(BASE_ONLY) >= 10


@pytest.mark.parametrize("name", TASKS)
def test_docker_oracle_scores_1_and_doing_nothing_scores_0(name: str, docker_backend: str) -> None:
    reward, info = play_oracle(name, docker_backend)
    assert reward == 1.0, f"{name}: oracle got {reward}: {info.get('verdicts')}"
    assert info["end_reason"] == "done" and "reward_problem" not in info
    reward, info = play_nothing(name, docker_backend)
    assert reward == 0.0, f"{name}: an agent that did nothing got {reward}"
    assert all(step == 0.0 for step in info["step_rewards"])


@pytest.mark.parametrize("name", BASE_ONLY)
def test_bwrap_oracle_scores_1_and_doing_nothing_scores_0(name: str, bwrap_backend: str) -> None:
    reward, info = play_oracle(name, bwrap_backend)
    assert reward == 1.0, f"{name}: oracle got {reward}: {info.get('verdicts')}"
    reward, info = play_nothing(name, bwrap_backend)
    assert reward == 0.0, f"{name}: an agent that did nothing got {reward}"


def play_word_counter(backend: str, replies: Callable[[list[str]], list[str]]
                      ) -> tuple[list[StepResult], HarborTerminalEnv]:
    """The multi-step task with ``replies(gold actions)``, one per step."""
    row = builtin_row(MULTI_STEP)
    env = HarborTerminalEnv(task=row, config={"backend": backend})
    try:
        env.reset(options={"task": row})
        gold = env.gold_actions()
        assert gold is not None and len(gold) == 3
        results = [env.step(action) for action in replies(gold)]
    finally:
        env.close()
    return results, env


def test_multi_step_oracle_pays_1_on_the_last_turn_only(docker_backend: str) -> None:
    results, env = play_word_counter(docker_backend, lambda gold: gold)
    verdicts = [(v.reward, v.problem, v.output_tail[-500:]) for v in env.verdicts]
    assert [r.reward for r in results] == [0.0, 0.0, 1.0], verdicts
    assert [r.terminated for r in results] == [False, False, True]
    assert results[0].info["step_reward"] == 1.0 and results[0].info["step"] == "setup"
    assert "Step 1 is complete" in results[0].observation[0]["content"]
    assert "step 2 of 3 (script)" in results[0].observation[0]["content"]
    assert results[-1].info["step_rewards"] == [1.0, 1.0, 1.0]
    assert env.get_metrics()["steps_verified"] == 3.0


def test_multi_step_solving_only_step_1_gets_the_mean(docker_backend: str) -> None:
    # step 1 solved and done; step 2 done without the script; step 3 done without the report
    (first, second, third), env = play_word_counter(
        docker_backend, lambda gold: [gold[0], bash("echo not writing the script", done=True), "<done/>"])
    assert first.info["step_reward"] == 1.0 and second.info["step_reward"] == 0.0
    assert third.terminated and third.info["step_rewards"] == [1.0, 0.0, 0.0]
    assert third.reward == pytest.approx(1 / 3)
    assert first.reward == second.reward == 0.0
    assert env.get_metrics()["passed"] == 0.0 and env.get_metrics()["steps_verified"] == 3.0


def test_bwrap_refuses_a_task_whose_tests_run_the_agents_code(bwrap_backend: str) -> None:
    """There the agent and the tests share one host user: the agent's code could write the reward."""
    row = builtin_row(MULTI_STEP)
    env = HarborTerminalEnv(task=row, config={"backend": bwrap_backend})
    try:
        env.reset(options={"task": row})
        result = env.step(bash("ls"))
    finally:
        env.close()
    assert result.truncated and result.reward == 0.0
    assert "needs a container runtime" in result.info["error"] and "tests_run_agent_code" in result.info["error"]


def test_bwrap_multi_step_mean_reward(bwrap_backend: str) -> None:
    row = builtin_row("notes-digest")
    env = HarborTerminalEnv(task=row, config={"backend": bwrap_backend})
    try:
        env.reset(options={"task": row})
        gold = env.gold_actions()
        first = env.step(gold[0])
        second = env.step(bash("echo 'lines=1 words=1' > /app/summary.txt", done=True))
    finally:
        env.close()
    assert first.info["step_reward"] == 1.0 and first.reward == 0.0
    assert second.terminated and second.info["step_rewards"] == [1.0, 0.0] and second.reward == 0.5
