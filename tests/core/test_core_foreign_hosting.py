"""What core gives envs from other ecosystems (issue 37, item 4): an async reset, per-task turn limits and
reward ceilings, a reward range per config, EnvSpec checked against its class, a formatted-wrong-answer
conformance episode, and a rejected last action that scores the bottom of the range."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any, ClassVar

import pytest
from skyrl_core import EnvConfig, EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.testing import check_env

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
TASKS = [{"id": "short", "secret": "blue", "rounds": 2, "best": 1.0},
         {"id": "long", "secret": "green", "rounds": 4, "best": 0.5}]


class AsyncSetup(TextEnv):
    """A peer-style env: its task setup is a coroutine (as in verifiers or an OpenEnv client)."""

    loops: ClassVar[list[int]] = []

    async def abuild_prompt(self) -> list[dict[str, str]]:
        await asyncio.sleep(0)
        AsyncSetup.loops.append(id(asyncio.get_running_loop()))
        return [{"role": "user", "content": f"Say {self.task['secret']}."}]

    def take_action(self, action: str) -> StepResult:
        return StepResult([], float(action.strip() == self.task["secret"]), True, False, {})

    def gold_actions(self) -> list[str]:
        return [self.task["secret"]]


def test_an_async_prompt_is_awaited_on_the_callers_loop_and_also_serves_sync_reset():
    env = AsyncSetup(task=TASKS[0])

    async def generator_side() -> tuple[Any, int]:
        return await env.areset(seed=0, options={"task": TASKS[0]}), id(asyncio.get_running_loop())

    AsyncSetup.loops.clear()
    (prompt, info), loop = asyncio.run(generator_side())
    assert prompt == [{"role": "user", "content": "Say blue."}] and info == {"max_turns": 1}
    assert AsyncSetup.loops == [loop]  # no private thread or loop: the generator's own
    assert env.reset(seed=0)[0] == prompt  # Gymnasium's sync reset runs the coroutine to its end

    async def sync_reset_inside_a_loop() -> list[dict[str, str]]:
        return env.reset(seed=0)[0]  # a sync caller inside async code must not deadlock the loop

    assert asyncio.run(sync_reset_inside_a_loop()) == prompt
    check_env(AsyncSetup, tasks=TASKS)


class StatefulAsync(AsyncSetup):
    """Per-episode state cleared in ``areset``: the sync ``reset`` goes through it."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.cleared = threading.get_ident()
        return await super().areset(seed=seed, options=options)


def test_an_env_that_overrides_areset_is_reset_through_it_from_sync_code():
    env = StatefulAsync(task=TASKS[0])
    prompt, _ = env.reset(seed=1)
    assert prompt[0]["content"] == "Say blue." and hasattr(env, "cleared")


class Rounds(TextEnv):
    """A game of the task's own number of rounds, whose best reachable reward depends on the deal."""

    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    @property
    def max_turns(self) -> int:
        return self.task["rounds"]

    def reward_ceiling(self) -> float:
        return self.task["best"]

    def take_action(self, action: str) -> StepResult:
        found = ANSWER.search(action)
        if found and found.group(1) == self.task["secret"]:
            return StepResult([], self.task["best"], True, False, {})
        return StepResult([{"role": "user", "content": "No."}], 0.0, False, False, {})

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{self.task['rounds']} rounds: name the colour in <answer></answer>."}]

    def gold_actions(self) -> list[str]:
        return [f"<answer>{self.task['secret']}</answer>"]


def test_per_task_turn_limits_and_ceilings_are_what_the_checks_expect():
    report = check_env(Rounds, tasks=TASKS, n_tasks=0)
    assert "gold[row 2]" in report.passed and "turn_limit" in report.passed  # gold scores the task's 0.5
    env = Rounds(task=TASKS[1])
    env.reset()
    for _ in range(3):
        assert not env.step("<answer>red</answer>").truncated
    assert env.step("<answer>red</answer>").truncated  # the task's 4 rounds, though config.max_turns is 1


def test_a_ceiling_the_gold_does_not_reach_fails_the_gold_check():
    class Overclaims(Rounds):
        def reward_ceiling(self) -> float:
            return 1.0

    report = check_env(Overclaims, tasks=TASKS[1:], raise_on_failure=False)
    assert any("gold[row 1]" in f and "expected the top of reward_range 1" in f for f in report.failed), report.failed


class Penalised(TextEnv):
    """Wrong answers cost 0.5; ``reject_action`` is not overridden."""

    class Config(EnvConfig):
        max_turns: int = 2

    config_class = Config
    reward_range: ClassVar[tuple[float, float]] = (-1.0, 1.0)

    def take_action(self, action: str) -> StepResult:
        right = action.strip() == "<answer>blue</answer>"
        return StepResult([] if right else [{"role": "user", "content": "Wrong."}], 1.0 if right else -0.5,
                          right, False, {})

    def gold_actions(self) -> list[str]:
        return ["<answer>blue</answer>"]


def test_an_empty_last_reply_scores_the_bottom_of_the_range_by_default():
    env = Penalised(task={"prompt": "Say blue in <answer></answer>."}, config={"max_turns": 2})
    env.reset()
    assert env.step("").reward == 0.0  # not the last turn: the model is told and may try again
    assert env.step("   ").reward == -1.0  # the last: an empty reply may not dodge the -0.5 of a wrong one
    env = Penalised(task={"prompt": "Say blue."}, config={"max_turns": 2})
    env.reset()
    assert env.step("wrong").reward == -0.5 and env.step("").reward == -0.5  # the total stops at the bottom
    assert env.episode_reward == -1.0


def test_a_reward_range_set_in_the_config_is_the_envs():
    env = Penalised(task={"prompt": "x"}, config={"reward_range": [-2, 3]})
    assert env.reward_range == (-2.0, 3.0) and Penalised.reward_range_for(env.config) == (-2.0, 3.0)
    assert Penalised(task={"prompt": "x"}).reward_range == (-1.0, 1.0)
    with pytest.raises(ValueError, match="low < high"):
        EnvConfig(reward_range=[1, 0])
    report = check_env(Penalised, tasks=[{"prompt": "Say blue."}], config={"reward_range": [-1, 0.5]},
                       raise_on_failure=False)
    assert any("gold[row 1]" in f and "expected the top of reward_range 0.5" in f for f in report.failed)


class FormatBonus(TextEnv):
    """Open the box, then answer; every well-formed answer earns a 0.3 format bonus, the right one 0.7 more."""

    class Config(EnvConfig):
        max_turns: int = 4

    config_class = Config

    def take_action(self, action: str) -> StepResult:
        if action.strip() == "<open/>":
            return StepResult([{"role": "user", "content": "Open."}], 0.0, False, False, {})
        found = ANSWER.search(action)
        bonus = 0.3 if found else 0.0
        if found and found.group(1) == "blue":
            return StepResult([], bonus + 0.7, True, False, {})
        return StepResult([{"role": "user", "content": "No."}], bonus, False, False, {})

    def gold_actions(self) -> list[str]:
        return ["<open/>", "<answer>blue</answer>"]


def test_a_format_reward_paid_on_every_wrong_turn_is_caught_by_the_formatted_wrong_episode():
    report = check_env(FormatBonus, tasks=[{"prompt": "Open the box, then name the colour."}], raise_on_failure=False)
    assert "episode:near_miss_then_gold" in report.passed and "episode:wrong_then_gold" in report.passed
    failure = next(f for f in report.failed if f.startswith("episode:formatted_wrong_then_gold"))
    assert "summed reward is 1.6 after turn 4, outside reward_range (0.0, 1.0)" in failure


def test_an_env_spec_that_disagrees_with_its_class_fails_the_spec_check(register_skyrl_plugin):
    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="penalised", entry_point=f"{__name__}:Penalised", max_turns=3))
            register(EnvSpec(id="honest", entry_point=f"{__name__}:Penalised", reward_range=(-1.0, 1.0),
                             max_turns=2))

    register_skyrl_plugin(Plugin())
    tasks = [{"prompt": "Say blue."}]
    report = check_env("penalised", tasks=tasks, raise_on_failure=False)
    spec = next(f for f in report.failed if f.startswith("spec"))
    assert "EnvSpec.reward_range is (0.0, 1.0) but Penalised gives (-1.0, 1.0)" in spec
    assert "EnvSpec.max_turns is 3 but Penalised's default config has max_turns=2" in spec
    assert "spec" in check_env("honest", tasks=tasks).passed


class AsyncPenalty(Penalised):
    """A peer whose scorer is a coroutine scores rejected actions too: an empty reply is a wrong one."""

    async def areject_action(self, problem: str) -> StepResult:
        await asyncio.sleep(0)
        return StepResult([{"role": "user", "content": problem}], -0.5, False, False, {"scored_by": "peer"})


def test_an_async_rejection_is_awaited_by_astep_and_run_by_step():
    env = AsyncPenalty(task={"prompt": "Say blue."})
    env.reset()
    assert asyncio.run(env.astep("")).info == {"scored_by": "peer"}
    env.reset()
    assert env.step("  ").reward == -0.5 and env.step("").reward == -0.5  # the peer's penalty, on the last turn too


def test_a_task_below_its_ranges_top_counts_as_passed_at_its_ceiling(scripted_engine, register_skyrl_plugin):
    from skyrl_core import GeneratorConfig, MultiTurnGenerator
    from skyrl_core.held_out import held_out_metrics

    class Plugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="rounds", entry_point=f"{__name__}:Rounds"))

    register_skyrl_plugin(Plugin())
    assert Rounds(task=TASKS[1]).reset()[1] == {"max_turns": 4, "reward_ceiling": 0.5}
    assert Rounds(task=TASKS[0]).reset()[1] == {"max_turns": 2}
    engine = scripted_engine(default="<answer>green</answer>")
    generator = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1), engine=engine, tokenizer=engine.tokenizer,
                                   env_id="rounds")
    batch = asyncio.run(generator.generate([TASKS[1]]))
    (episode,) = batch.trajectories
    assert episode.reward == 0.5 and episode.reward_ceiling == 0.5
    assert held_out_metrics(batch, (0.0, 1.0))["eval/pass_rate"] == 1.0
