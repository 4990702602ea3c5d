"""The ``spread_bench`` env of ``bench/async_vs_sync.py``: multi-turn episodes whose length varies a lot.

Each task fixes its number of turns (mostly 1-3, a long tail up to 10) and the latency of the "tool"
that answers each turn (log-normal around ``median_ms``, like a sandbox or API call), both drawn
from the task's index with a fixed seed, so every mode sees the same work. The reward, paid at the
episode's end, is the share of the letter ``e`` among the characters the model wrote (learnable by
tiny-random within a few steps, like the trainer tests' ``letter_e``).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl

ENV_ID = "spread_bench"
TURNS = [1, 1, 1, 2, 2, 3, 3, 4, 6, 10]  # drawn uniformly: median 2.5 turns, 10% of episodes take 10


def make_tasks(count: int, median_ms: float, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": f"s{i}", "turns": rng.choice(TURNS), "latency_ms": min(median_ms * rng.lognormvariate(0, 0.8),
                                                                          20 * median_ms)}
            for i in range(count)]


class SpreadEnv(TextEnv):
    """``task["turns"]`` turns; each reply waits ``task["latency_ms"]`` (a tool call) before the next."""

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Write the letter e many times ({self.task['id']})."}]

    async def atake_action(self, action: str) -> StepResult:
        self._written = getattr(self, "_written", "") + action
        await asyncio.sleep(self.task["latency_ms"] / 1000)
        turn = getattr(self, "_turn", 0) + 1
        self._turn = turn
        if turn >= self.task["turns"]:
            return StepResult([], self._written.count("e") / max(len(self._written), 1), True, False, {})
        return StepResult([{"role": "user", "content": "More."}], 0.0, False, False, {})

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return make_tasks(32, 20.0)


@hookimpl
def register_envs(register: Any) -> None:
    register(EnvSpec(id=ENV_ID, entry_point="_spread_env:SpreadEnv", max_turns=max(TURNS)))
