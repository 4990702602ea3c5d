"""A multi-turn verifiers env for the bridge's tests: guess a secret number, the env answers higher/lower.

The env's own ``run()`` drives the exchange through ``agents.player.interaction(task)``, as verifiers'
TextArena env does: a bare ``turn()`` takes the opening reply, each later ``turn(feedback)`` the next one.
Rewards on the task: ``solved`` (weight 1.0) and ``malformed`` (weight -0.25: the share of replies with no
``<guess>N</guess>``).
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>")


class GuessData(vf.TaskData):
    secret: int
    low: int = 1
    high: int = 20


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        return float(trace.info.get("solved", False))

    @vf.reward(weight=-0.25)
    async def malformed(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return sum(not GUESS.search(r) for r in replies) / len(replies) if replies else 1.0


class GuessConfig(vf.TasksetConfig):
    count: int = 3


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        rng = random.Random(7)
        for i in range(self.config.count):
            yield GuessTask(GuessData(name=f"guess-{i}", secret=rng.randint(1, 20),
                                      system_prompt="Guess the secret number. Reply with <guess>N</guess>.",
                                      prompt="I picked a number from 1 to 20. Your first guess?"),
                            self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        random.random()  # touches the process RNG, as TextArena's env does; the bridge must isolate it
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                found = GUESS.findall(segment.last_reply)
                if not found:
                    feedback = "No <guess>N</guess> found. Guess again."
                elif int(found[0]) == task.data.secret:
                    interaction.trace.info["solved"] = True
                    break
                else:
                    feedback = "Higher." if int(found[0]) < task.data.secret else "Lower."
                segment = await interaction.turn(feedback)


def load_environment(count: int = 3) -> GuessEnv:
    return GuessEnv(GuessEnvConfig(taskset={"id": "vf_bridge_guess", "count": count}))


__all__ = ["GuessEnv", "GuessTaskset"]
