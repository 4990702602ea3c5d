"""``check_adversarial`` finds the reward bugs this project fixed: each reintroduced in a small env is flagged
with its reason, and the same env without the bug passes.

The envs are variants of one guessing game (name the secret word in ``<answer></answer>`` within three
tries; 1 for the right word, 0 for a wrong one), each with one bug an RL policy would find.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import pytest
from skyrl_core import EnvConfig, StepResult, TextEnv
from skyrl_core.probe import Probe
from skyrl_core.testing import RewardHackError, check_adversarial
from skyrl_core.testing.adversarial import GENERIC_PROBES, QUICK_PROBES, near_miss

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TASKS = [{"id": "sky", "secret": "blue"}, {"id": "grass", "secret": "green"}]


class GuessConfig(EnvConfig):
    max_turns: int = 3


class Guess(TextEnv):
    """The game without a bug."""

    config_class = GuessConfig
    reward_range: ClassVar[tuple[float, float]] = (-1.0, 1.0)

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Name the secret colour in <answer></answer>. Three tries."}]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.replies: list[str] = []
        return super().reset(seed=seed, options=options)

    def answer(self, action: str) -> str | None:
        found = ANSWER.search(action)
        return found.group(1).strip() if found else None

    def correct(self, action: str) -> bool:
        return self.answer(action) == self.task["secret"]

    def feedback(self, action: str) -> str:
        return "Wrong. Try again." if self.answer(action) is not None else "Answer in <answer></answer>."

    def take_action(self, action: str) -> StepResult:
        self.replies.append(action)
        if self.correct(action):
            return StepResult([], 1.0, True, False, {"correct": True})
        return StepResult([{"role": "user", "content": self.feedback(action)}], self.wrong_reward(), False, False, {})

    def wrong_reward(self) -> float:
        return 0.0

    def gold_actions(self) -> list[str]:
        return [f"<answer>{self.task['secret']}</answer>"]

    def get_metrics(self) -> dict[str, float]:
        return {"correct": float(any(self.correct(reply) for reply in self.replies))}

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> list[dict[str, Any]]:
        return TASKS


# --- the bugs ----------------------------------------------------------------------------------------------------


class FormatCheckReadsObservations(Guess):
    """A format bonus for a well-formed answer tag anywhere in the transcript, the env's own feedback included."""

    def feedback(self, action: str) -> str:
        return "Wrong. Reply like <answer>red</answer>." if "<" in action else "Answer in <answer></answer>."

    def take_action(self, action: str) -> StepResult:
        result = super().take_action(action)
        transcript = [*self.replies, *(m["content"] for m in result.observation)]
        bonus = 0.1 if not result.terminated and self.turn == self.max_turns and any(
            self.answer(text) for text in transcript) else 0.0
        return result._replace(reward=result.reward + bonus)


class PenaltyFixed(Guess):
    """Malformed replies (no answer tag) cost 0.3 each, empty ones included: the game with a format penalty."""

    def wrong_reward(self) -> float:
        return -0.3 if self.answer(self.replies[-1]) is None else 0.0

    def reject_action(self, problem: str) -> StepResult:
        return StepResult([{"role": "user", "content": problem}], -0.3, False, False, {"invalid_action": problem})

    def null_action(self) -> str:
        return "<answer>?</answer>"


class RejectedLastActionSkipsPenalty(PenaltyFixed):
    """The penalty of a rejected (empty) reply is forgotten on the last turn."""

    def reject_action(self, problem: str) -> StepResult:
        result = super().reject_action(problem)
        return result._replace(reward=0.0) if self.turn >= self.max_turns else result


class StateSurvivesReset(Guess):
    """The best try is paid at the turn limit, and ``reset`` does not clear it: one solve pays every later episode."""

    best = 0.0

    def take_action(self, action: str) -> StepResult:
        result = super().take_action(action)
        if result.terminated:
            self.best = 1.0
        return result._replace(reward=self.best) if self.turn >= self.max_turns and not result.terminated else result


class RevealsTheAnswer(Guess):
    """Feedback that names the answer: text the env wrote becomes the model's answer."""

    def feedback(self, action: str) -> str:
        return f"Wrong: it was <answer>{self.task['secret']}</answer>. Try again."


class CrashesOnControlCharacters(Guess):
    """A logging step that cannot encode what the model wrote: an env error, so the episode is dropped."""

    def take_action(self, action: str) -> StepResult:
        action.encode("ascii")
        return super().take_action(action)


class AnyAnswerCounts(Guess):
    """Every answer tag of a reply is tried: a policy hedges with several."""

    def correct(self, action: str) -> bool:
        return self.task["secret"] in (found.strip() for found in ANSWER.findall(action))


class AcceptsANearMiss(Guess):
    """A lenient comparison: the first two letters are enough."""

    def correct(self, action: str) -> bool:
        answer = self.answer(action)
        return answer is not None and answer[:2] == self.task["secret"][:2]


class JoinsRepliesIntoOneAnswer(Guess):
    """Replies are joined before the answer is read, so an answer split over two turns counts."""

    def correct(self, action: str) -> bool:
        return self.answer("".join(self.replies)) == self.task["secret"] or super().correct(action)


class PaysEveryWellFormedTry(Guess):
    """A progress reward per well-formed try, summed by the generator: trying again and again pays."""

    def wrong_reward(self) -> float:
        return 0.2 if self.answer(self.replies[-1]) is not None else 0.0


class TwoStepsConfig(EnvConfig):
    max_turns: int = 4


class TwoSteps(Guess):
    """Open the box (``<open/>``), then name the colour; the episode's reward is paid on the answer."""

    config_class = TwoStepsConfig

    def take_action(self, action: str) -> StepResult:
        self.replies.append(action)
        if "<open/>" in action:
            return StepResult([{"role": "user", "content": "The box is open."}], self.open_reward(), False, False, {})
        opened = any("<open/>" in reply for reply in self.replies)
        if opened and self.correct(action):
            return StepResult([], 1.0 - self.open_reward(), True, False, {})
        return StepResult([{"role": "user", "content": self.feedback(action)}], 0.0, False, False, {})

    def open_reward(self) -> float:
        return 0.0

    def gold_actions(self) -> list[str]:
        return ["<open/>", f"<answer>{self.task['secret']}</answer>"]


class PaysTheFirstStepInFull(TwoSteps):
    """The whole reward on the first step: the answer, the step that proves the work, pays nothing."""

    def open_reward(self) -> float:
        return 1.0


class RaisesOutOfStep(Guess):
    """A step that raises before the base class can turn the failure into an observation."""

    def step(self, action: str) -> StepResult:
        if action and not action.strip():
            raise ValueError("whitespace reply")
        return super().step(action)


BUGS: list[tuple[type[TextEnv], str, str]] = [
    (FormatCheckReadsObservations, "echo", "above the null agent"),
    (RejectedLastActionSkipsPenalty, "empty_last", "dodged a penalty"),
    (RevealsTheAnswer, "echo", "above the null agent"),
    (CrashesOnControlCharacters, "control_chars", "env error"),
    (AnyAnswerCounts, "gold_hedged", "above the null agent"),
    (AcceptsANearMiss, "near_miss", "gold's full reward"),
    (JoinsRepliesIntoOneAnswer, "gold_split", "above the null agent"),
    (PaysEveryWellFormedTry, "replay", "above an honest wrong answer"),
    (PaysTheFirstStepInFull, "gold_truncated", "gold's full reward"),
    (RaisesOutOfStep, "whitespace_first", "raised ValueError"),
]


@pytest.mark.parametrize(("env", "probe", "reason"), BUGS, ids=[bug.__name__ for bug, _, _ in BUGS])
def test_each_reintroduced_bug_is_flagged_with_its_reason(env: type[TextEnv], probe: str, reason: str):
    report = check_adversarial(env, tasks=TASKS)
    flagged = {outcome.probe: outcome for outcome in report.flagged}
    assert probe in flagged, f"{env.__name__}: {probe} not flagged; flagged: {sorted(flagged)}"
    assert reason in flagged[probe].flags[0], flagged[probe].flags
    assert flagged[probe].example is not None and flagged[probe].example["task"] in ("sky", "grass")


def test_state_that_survives_reset_is_flagged_as_a_leak():
    report = check_adversarial(StateSurvivesReset, tasks=TASKS)
    assert report.leaks and "state survives reset()" in report.leaks[0] and not report.ok


@pytest.mark.parametrize("env", [Guess, PenaltyFixed, TwoSteps])
def test_the_games_without_the_bugs_pass(env: type[TextEnv]):
    report = check_adversarial(env, tasks=TASKS, raise_on_flag=True)
    assert report.ok and len(report.outcomes) == len(GENERIC_PROBES)


def test_a_flag_raises_in_a_one_line_test():
    with pytest.raises(RewardHackError, match=r"echo: sky: scored 1, above the null agent's 0"):
        check_adversarial(RevealsTheAnswer, tasks=TASKS, raise_on_flag=True)


def test_the_success_metric_is_shown_but_never_excuses_a_flag():
    report = check_adversarial(RevealsTheAnswer, tasks=TASKS)
    echo = next(outcome for outcome in report.outcomes if outcome.probe == "echo")
    assert echo.success == [1.0, 1.0] and echo.flags  # the env says "correct": the probe is flagged all the same


def test_no_probe_is_given_the_answer():
    """A gold-derived probe plays a near miss: on the plain game each one scores 0, as a wrong guess does."""
    report = check_adversarial(Guess, tasks=TASKS)
    scored = {o.probe: o.rewards for o in report.outcomes if any(reward > 0 for reward in o.rewards)}
    assert not scored, scored  # an empty last reply scores the bottom, -1: nothing scores above a wrong guess
    from_gold = [o for o in report.outcomes if o.probe in ("near_miss", "gold_hedged", "gold_split", "replay")]
    assert from_gold and all(reward == 0.0 for outcome in from_gold for reward in outcome.rewards)
    assert near_miss("<answer>blue</answer>") == "<answer>blve</answer>" and near_miss("ab 41") == "ab 52"


def test_a_plugin_registers_probes_for_its_env(skyrl_plugin_manager, register_skyrl_plugin):
    from skyrl_core import EnvSpec, hookimpl

    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="guess", entry_point=f"{__name__}:Guess"))

        @hookimpl
        def register_probes(self, register):
            register(Probe("says_blue", lambda turn: "<answer>blue</answer>", "a plugin's own probe", env="guess"))
            register(Probe("elsewhere", lambda turn: "", "another env's", env="other"))

    register_skyrl_plugin(Plugin())
    report = check_adversarial("guess", tasks=TASKS[:1], quick=True)
    names = [outcome.probe for outcome in report.outcomes]
    assert "says_blue" in names and "elsewhere" not in names and set(names) - {"says_blue"} <= QUICK_PROBES
    assert report.flagged[0].probe == "says_blue"  # it plays the answer itself: the probe author broke the rule


def test_exempt_and_skipped_probes_are_reported_with_their_reason():
    class CommandsRunInOrder(AnyAnswerCounts):
        adversarial_exempt: ClassVar[dict[str, str]] = {"gold_hedged": "every command of a reply runs"}

    report = check_adversarial(CommandsRunInOrder, tasks=TASKS, skip={"long"})
    assert report.ok and report.exempt == {"gold_hedged": "every command of a reply runs"}
    assert report.skipped == {"long": "skipped by request"}
    with pytest.raises(ValueError, match="Did you mean 'echo'"):
        check_adversarial(Guess, tasks=TASKS, skip={"ecoh"})


def test_the_cli_prints_the_table_and_exits_1_on_a_flag(skyrl_plugin_manager, register_skyrl_plugin, skyrl_cli):
    from skyrl_core import EnvSpec, hookimpl

    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="reveals", entry_point=f"{__name__}:RevealsTheAnswer"))
            register(EnvSpec(id="plain", entry_point=f"{__name__}:Guess"))

    register_skyrl_plugin(Plugin())
    result = skyrl_cli("check", "reveals", "--adversarial", "--tasks", "1", "--quick")
    assert result.exit_code == 1, result.output
    assert "FLAG  echo" in result.output and "observation:" in result.output
    quick, skipped = len(QUICK_PROBES), len(GENERIC_PROBES) - len(QUICK_PROBES)
    assert result.output.strip().splitlines()[-1] == f"{quick - 1} passed, 1 failed, {skipped} skipped"
    result = skyrl_cli("check", "plain", "--adversarial", "--json")
    assert result.exit_code == 0, result.output
    parsed = json.loads(result.stdout)
    assert parsed["ok"] and parsed["tasks"] == ["sky", "grass"] and len(parsed["probes"]) == len(GENERIC_PROBES)
