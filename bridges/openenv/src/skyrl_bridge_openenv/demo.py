"""``demo``: the smallest useful OpenEnv env, shipped so ``skyrl check openenv`` runs with no options.

One step: add two numbers drawn from the reset seed and reply with JSON ``{"answer": N}``; reward 1 when right.
It also shows the two optional hooks the bridge reads from an OpenEnv ``Environment`` class: ``reward_range``
(the episode's reward range) and ``gold_actions()`` (actions that solve the current episode).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from skyrl_bridge_openenv._peer import load_openenv_core

load_openenv_core()  # before openenv.core: skip its web UI's import time

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402


class SumAction(Action):
    answer: int = Field(..., description="The sum of the two numbers")


class SumObservation(Observation):
    text: str = Field("", description="The question, or whether the answer was right")


class SumEnvironment(Environment[SumAction, SumObservation, State]):
    reward_range = (0.0, 1.0)

    def __init__(self, low: int = 0, high: int = 99) -> None:
        super().__init__()
        self.low, self.high = low, high
        self._state = State()
        self._terms = (0, 0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> SumObservation:
        rng = random.Random(seed)
        self._terms = (rng.randint(self.low, self.high), rng.randint(self.low, self.high))
        self._state = State(episode_id=episode_id or str(uuid.UUID(int=rng.getrandbits(128))), step_count=0)
        return SumObservation(text=f"What is {self._terms[0]} + {self._terms[1]}?")

    def step(self, action: SumAction, timeout_s: float | None = None, **kwargs: Any) -> SumObservation:
        self._state.step_count += 1
        right = action.answer == sum(self._terms)
        return SumObservation(text="Right." if right else "Wrong.", reward=1.0 if right else 0.0, done=True)

    @property
    def state(self) -> State:
        return self._state

    def gold_actions(self) -> list[SumAction]:
        return [SumAction(answer=sum(self._terms))]
