"""Small OpenEnv environments for the openenv bridge's tests, built on OpenEnv's own base classes.

- ``EchoEnvironment``: echo two seeded words back, one per turn; 0.5 per word echoed (a per-step reward). Its
  action has one string field, so the model's raw text is the action. It draws from the GLOBAL ``random`` (as
  careless envs do), which the bridge must leave as it found it.
- ``GuessEnvironment``: guess a hidden number in [1, high] (drawn from the GLOBAL ``numpy.random``) with a typed
  int action, told higher/lower; +1 when found, -0.1 per wrong guess, 7 guesses at most.
- ``SlowEnvironment``: echo, but ``step`` sleeps ``delay`` seconds (a server that stops answering).
- ``BrokenEnvironment``: its constructor raises (a server whose env cannot be built).

Every env keeps what it received in ``RECEIVED`` (class-level, for in-process tests) so tests can assert the
peer never saw text that makes no valid action.
"""

from __future__ import annotations

import random
import time
from typing import Any, ClassVar

import numpy as np
from skyrl_bridge_openenv._peer import load_openenv_core

load_openenv_core()  # openenv.core without its web UI (Gradio), as the bridge imports it: seconds faster

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import Field  # noqa: E402

WORDS = ("apple", "river", "stone", "cloud", "maple", "ember", "frost", "lemon", "tiger", "pearl")


class EchoAction(Action):
    message: str = Field(..., description="The word to echo")


class EchoObservation(Observation):
    text: str = ""


class EchoEnvironment(Environment[EchoAction, EchoObservation, State]):
    reward_range = (0.0, 1.0)
    RECEIVED: ClassVar[list[Any]] = []

    def __init__(self, words: int = 2) -> None:
        super().__init__()
        self.count = words
        self.words: list[str] = []
        self.done_words = 0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        random.seed(seed)  # the global RNG, on purpose
        self.words = [random.choice(WORDS) for _ in range(self.count)]
        self.done_words = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(text=f"Echo this word back exactly: {self.words[0]}")

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any) -> EchoObservation:
        type(self).RECEIVED.append(action)
        self._state.step_count += 1
        word = self.words[self.done_words]
        if action.message.strip() != word:
            return EchoObservation(text=f"That was not it. Echo: {word}", reward=0.0)
        self.done_words += 1
        if self.done_words == len(self.words):
            return EchoObservation(text="All words echoed.", reward=1.0 / len(self.words), done=True)
        return EchoObservation(text=f"Good. Now echo: {self.words[self.done_words]}", reward=1.0 / len(self.words))

    @property
    def state(self) -> State:
        return self._state

    def gold_actions(self) -> list[EchoAction]:
        return [EchoAction(message=word) for word in self.words]


class GuessAction(Action):
    guess: int = Field(..., ge=1, le=1000, description="Your guess")


class GuessObservation(Observation):
    feedback: str = ""
    guesses_left: int = 0


class GuessEnvironment(Environment[GuessAction, GuessObservation, State]):
    reward_range = (-0.7, 1.0)
    RECEIVED: ClassVar[list[Any]] = []
    MAX_GUESSES = 7

    def __init__(self, high: int = 100) -> None:
        super().__init__()
        self.high = high
        self.target = 0
        self.left = self.MAX_GUESSES
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        np.random.seed(seed)  # the global numpy RNG, on purpose
        self.target = int(np.random.randint(1, self.high + 1))
        self.left = self.MAX_GUESSES
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=f"I picked a number from 1 to {self.high}.", guesses_left=self.left)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        type(self).RECEIVED.append(action)
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(feedback="Correct!", guesses_left=self.left, reward=1.0, done=True)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(feedback=f"Wrong, go {hint}.", guesses_left=self.left, reward=-0.1,
                                done=self.left == 0)

    @property
    def state(self) -> State:
        return self._state

    def gold_actions(self) -> list[GuessAction]:
        return [GuessAction(guess=self.target)]


class SlowEnvironment(EchoEnvironment):
    def __init__(self, delay: float = 30.0) -> None:
        super().__init__()
        self.delay = delay

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any) -> EchoObservation:
        time.sleep(self.delay)
        return super().step(action)


class BrokenEnvironment(EchoEnvironment):
    def __init__(self) -> None:
        raise RuntimeError("this env needs a data file that is not here (set DATA_DIR)")


ECHO = f"{__name__}:EchoEnvironment"
GUESS = f"{__name__}:GuessEnvironment"
SLOW = f"{__name__}:SlowEnvironment"
BROKEN = f"{__name__}:BrokenEnvironment"
