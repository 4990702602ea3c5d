"""check_env must catch each kind of broken env, not only pass good ones."""

from __future__ import annotations

import random
import threading
import warnings

import pytest
from core_envs import CountdownEnv
from skyrl_core import StepResult
from skyrl_core.testing import EnvCheckError, check_env

TASKS = [{"n": 1}]


def test_good_env_passes():
    report = check_env(CountdownEnv, tasks=TASKS, config={"max_turns": 3})
    assert not report.failed and {"gold[row 1]", "action:empty_at_turn_limit"} <= set(report.passed)


class RaisesOnGarbage(CountdownEnv):
    def take_action(self, action):
        if "\x00" in action:
            raise UnicodeError("cannot handle NUL")
        return super().take_action(action)


class Random(CountdownEnv):
    def take_action(self, action):
        return StepResult([{"role": "user", "content": str(random.random())}], 0.0, False, False, {})


class WrongGold(CountdownEnv):
    def gold_actions(self):
        return ["nope"]


class Unpicklable(CountdownEnv):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()


class SilentOnBadAction(CountdownEnv):
    def take_action(self, action):
        return StepResult([], 0.0, False, False, {})


class RejectRaisesAtTheLastTurn(CountdownEnv):
    def reject_action(self, problem):
        if self.turn >= self.max_turns:
            raise LookupError("no score for an empty episode")
        return super().reject_action(problem)


class RejectOutOfRange(CountdownEnv):
    def reject_action(self, problem):
        return super().reject_action(problem)._replace(reward=-5.0)


class NeverEnds(CountdownEnv):
    def step(self, action):
        return StepResult([{"role": "user", "content": "more"}], 0.0, False, False, {})


@pytest.mark.parametrize("env_cls, expected", [
    (RaisesOnGarbage, "action:garbage: a bad action must get an observation, not an infrastructure error"),
    (Random, "determinism: the same seed"),
    (WrongGold, "gold[row 1]: the gold actions did not terminate"),
    (Unpicklable, "pickle: raised TypeError"),
    (SilentOnBadAction, "got no observation"),
    (NeverEnds, "turn_limit: episode still running after max_turns=3"),
    (RejectRaisesAtTheLastTurn, "action:empty_at_turn_limit: a bad action must get an observation, not an "
                                "infrastructure error: LookupError"),
    (RejectOutOfRange, "action:empty: the episode's reward -5 is outside reward_range"),
])
def test_broken_envs_fail_with_a_named_check(env_cls, expected):
    with pytest.raises(EnvCheckError) as err:
        check_env(env_cls, tasks=TASKS, config={"max_turns": 3})
    assert expected in str(err.value)


class WarnsAboutItsData(CountdownEnv):
    @classmethod
    def load_dataset(cls, split="train", config=None):
        warnings.warn("rows.jsonl:3: the gold answer looks truncated", UserWarning, stacklevel=2)
        warnings.warn("rows.jsonl:3: the gold answer looks truncated", UserWarning, stacklevel=2)
        return super().load_dataset(split, config)


def test_dataset_warnings_are_reported_without_failing_the_check():
    report = check_env(WarnsAboutItsData, config={"max_turns": 3}, n_tasks=1)
    assert not report.failed
    assert report.warnings == ["rows.jsonl:3: the gold answer looks truncated"]
    assert check_env(CountdownEnv, config={"max_turns": 3}, n_tasks=1).warnings == []
