"""The env contract as check_env enforces it: summed episode rewards stay in range, every row is checked,
Gymnasium's checker runs too, and checks that cannot hold for an env can be skipped by name."""

from __future__ import annotations

import random
from typing import Any

import pytest
from skyrl_core import EnvSpec, StepResult, hookimpl
from skyrl_core.testing import EnvCheckError, check_env
from skyrl_reverse_text.env import ANSWER, ReverseTextEnv

TASKS = [{"id": "apple", "text": "apple"}]


class PartialCreditEveryTry(ReverseTextEnv):
    """The tutorial as it was: partial credit paid on every wrong try, so wrong-then-right scores above 1."""

    def take_action(self, action: str) -> StepResult:
        match = ANSWER.search(action)
        target = self.task["text"][::-1]
        if match is None or match.group(1).strip() == target:
            return super().take_action(action)
        answer = match.group(1).strip()
        prefix = next((i for i, (a, b) in enumerate(zip(answer, target, strict=False)) if a != b), len(answer))
        return StepResult([{"role": "user", "content": "Try again."}], 0.5 * prefix / len(target), False, False, {})


class PenaltyEveryTurn(ReverseTextEnv):
    """-0.5 for each malformed turn against a floor of -1: hostile turns in a row sink below the range."""

    reward_range = (-1.0, 1.0)

    def take_action(self, action: str) -> StepResult:
        result = super().take_action(action)
        return result._replace(reward=-0.5) if not result.info["format_ok"] else result

    def reject_action(self, problem: str) -> StepResult:
        return super().reject_action(problem)._replace(reward=-0.5)


class NoSuperReset(ReverseTextEnv):
    """Skips ``super().reset``, so a seed never reaches the env's RNG: Gymnasium's checker notices."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.turn, self.done = 0, False
        return self.build_prompt(), {}


class JudgedEnv(ReverseTextEnv):
    """Feedback worded by a sampling judge: the same actions never give the same observations twice."""

    def take_action(self, action: str) -> StepResult:
        result = super().take_action(action)
        if result.terminated:
            return result
        return result._replace(observation=[{"role": "user", "content": f"Judge #{random.random()}: try again."}])


def test_the_old_tutorial_reward_hack_is_caught() -> None:
    with pytest.raises(EnvCheckError) as err:
        check_env(PartialCreditEveryTry, tasks=TASKS, config={"max_turns": 2})
    assert ("episode:near_miss_then_gold: the episode's summed reward is 1.3 after turn 2, outside reward_range "
            "(0.0, 1.0)") in str(err.value)


def test_the_tutorial_pays_once_and_passes_every_check() -> None:
    report = check_env("reverse_text", tasks=TASKS, config={"max_turns": 2})
    assert {"episode:hostile", "episode:wrong_then_gold", "episode:near_miss_then_gold", "gymnasium",
            "prompt[row 1]", "gold[row 1]"} <= set(report.passed)
    env = ReverseTextEnv(task=TASKS[0], config={"max_turns": 2})
    env.reset(seed=0)
    rewards = [env.step("<answer>elpxa</answer>").reward, env.step("<answer>elppa</answer>").reward]
    assert rewards == [0.0, 1.0]
    env.reset(seed=0)
    rewards = [env.step("no tags").reward, env.step("<answer>elpxa</answer>").reward]
    assert rewards == [0.0, pytest.approx(0.5 * 3 / 5)]  # partial credit on the last try only


def test_hostile_turns_that_sum_below_the_range_are_caught() -> None:
    with pytest.raises(EnvCheckError) as err:
        check_env(PenaltyEveryTurn, tasks=TASKS, config={"max_turns": 4})
    assert "episode:hostile: the episode's summed reward is -1.5 after turn 3" in str(err.value)


def test_gymnasium_checker_failures_are_reported_as_a_check() -> None:
    report = check_env(NoSuperReset, tasks=TASKS, raise_on_failure=False)
    (failure,) = [f for f in report.failed if f.startswith("gymnasium:")]
    assert "does not call `super().reset(seed=seed)`" in failure


def test_skip_lets_a_judged_env_pass_and_reports_what_was_skipped() -> None:
    with pytest.raises(EnvCheckError, match="determinism: the same seed"):
        check_env(JudgedEnv, tasks=TASKS, config={"max_turns": 2})
    report = check_env(JudgedEnv, tasks=TASKS, config={"max_turns": 2}, skip={"determinism"})
    assert report.skipped == ["determinism"] and "gymnasium" in report.passed and not report.failed
    assert check_env(JudgedEnv, tasks=TASKS, skip={"determinism", "gold"}).skipped == ["determinism", "gold[row 1]"]


def test_an_unknown_skip_name_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="unknown check 'determinsm' in skip. Did you mean 'determinism'?"):
        check_env(JudgedEnv, tasks=TASKS, skip={"determinsm"})


class TwoBadRowsEnv(ReverseTextEnv):
    """Row 'no-text' cannot build a prompt; row 'bad-gold' has gold actions that do not solve it."""

    def gold_actions(self) -> list[str]:
        return ["<answer>wrong</answer>"] if self.task.get("id") == "bad-gold" else super().gold_actions()

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": "ok-0", "text": "ab"}, {"id": "no-text"}, {"id": "ok-2", "text": "cd"},
                {"id": "bad-gold", "text": "ef"}]


class TwoBadRowsPlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="two_bad_rows", entry_point="test_core_env_contract:TwoBadRowsEnv", max_turns=2,
                         description="a dataset with broken rows"))


def test_check_all_rows_names_each_failing_row(skyrl_cli, register_skyrl_plugin) -> None:
    register_skyrl_plugin(TwoBadRowsPlugin())
    result = skyrl_cli("check", "two_bad_rows", "--all-rows")
    assert result.exit_code == 1
    failing = sorted(line.split(":")[0] for line in result.output.splitlines() if line.startswith("FAIL"))
    assert failing == ["FAIL  gold[row 4] (bad-gold)", "FAIL  prompt[row 2] (no-text)"]
    assert "reverse_text task needs a non-empty 'text' field" in result.output
    assert "PASS  gold[row 3] (ok-2)" in result.output and "PASS  prompt[row 4] (bad-gold)" in result.output
    assert "SKIP  gold[row 2] (no-text)" in result.output  # a row whose prompt fails plays no gold episode
    assert "bad rows (2): row 2 (no-text), row 4 (bad-gold)" in result.output
    assert "0 passed" not in result.output and "2 failed" in result.output


class BadFirstRowEnv(TwoBadRowsEnv):
    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": "no-text"}, {"text": "ab"}, {"text": ""}]


def test_all_rows_checks_every_prompt_first_and_plays_the_rest_on_a_good_row() -> None:
    report = check_env(BadFirstRowEnv, n_tasks=0, raise_on_failure=False)
    assert [line.split(":")[0] for line in report.failed] == ["prompt[row 1] (no-text)", "prompt[row 3]"]
    assert report.bad_rows == ["row 1 (no-text)", "row 3"]
    assert {"pickle", "determinism", "gymnasium", "episode:hostile", "gold[row 2]"} <= set(report.passed)
    assert {"gold[row 1]", "gold[row 3]"} <= set(report.skipped)
    nothing_builds = check_env(BadFirstRowEnv, tasks=[{"id": "x"}], raise_on_failure=False)
    assert nothing_builds.failed == ["prompt[row 1] (x): raised ValueError: reverse_text task needs a non-empty 'text' field"]
    assert "pickle" in nothing_builds.skipped and not nothing_builds.passed


def test_check_skip_option_and_its_errors(skyrl_cli) -> None:
    result = skyrl_cli("check", "reverse_text", "--skip", "gymnasium", "--skip", "episode")
    assert result.exit_code == 0, result.output
    assert "SKIP  gymnasium" in result.output and "SKIP  episode:hostile" in result.output
    assert "0 failed, 5 skipped" in result.output
    bad = skyrl_cli("check", "reverse_text", "--skip", "gymnasum")
    assert bad.exit_code == 2 and "Did you mean 'gymnasium'?" in bad.output
