"""Small envs and helpers for the trainer tests (importable because pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skyrl_core import EngineSpec, EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig


class LetterEnv(TextEnv):
    """Reward: the share of the reply's characters that are the letter ``e`` (dense, learnable fast)."""

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Write the letter e many times ({self.task['id']})."}]

    def take_action(self, action: str) -> StepResult:
        return StepResult([], action.count("e") / max(len(action), 1), True, False, {})

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": f"t{i}"} for i in range(4)]


class FlakyLetterEnv(LetterEnv):
    """Like ``LetterEnv`` but its backend fails for the tasks marked ``broken`` (an infrastructure error)."""

    def take_action(self, action: str) -> StepResult:
        if self.task.get("broken"):
            raise ConnectionError("grader backend unavailable")
        return super().take_action(action)

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": "ok0"}, {"id": "bad", "broken": True}]


class HalfFlatLetterEnv(LetterEnv):
    """Like ``LetterEnv`` but the task marked ``flat`` pays 0.5 whatever the reply (a zero-variance group)."""

    def take_action(self, action: str) -> StepResult:
        if self.task.get("flat"):
            return StepResult([], 0.5, True, False, {})
        return super().take_action(action)

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": "flat", "flat": True}, {"id": "e0"}]


class SleepyHFEngineConfig(HFEngineConfig):
    enable_sleep_mode: bool = True


class SleepyHFEngine(HFEngine):
    """The hf engine plus vLLM-style ``sleep``/``wake_up`` that record the order of engine calls in ``EVENTS``."""

    EVENTS: list[str] = []

    async def generate(self, prompt_ids, params):
        if not self.EVENTS or self.EVENTS[-1] != "generate":
            self.EVENTS.append("generate")
        return await super().generate(prompt_ids, params)

    async def update_weights(self, named_tensors):
        self.EVENTS.append("update_weights")
        await super().update_weights(named_tensors)

    async def sleep(self, level=1):
        self.EVENTS.append(f"sleep({level})")

    async def wake_up(self, tags=None):
        self.EVENTS.append(f"wake_up({','.join(tags)})")


class TrainerTestEnvs:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="letter_e", entry_point="trainer_support:LetterEnv", max_turns=1))
        register(EnvSpec(id="flaky_letter_e", entry_point="trainer_support:FlakyLetterEnv", max_turns=1))
        register(EnvSpec(id="half_flat_letter_e", entry_point="trainer_support:HalfFlatLetterEnv", max_turns=1))

    @hookimpl
    def register_inference_engines(self, register):
        register(EngineSpec(id="sleepy_hf", entry_point="trainer_support:SleepyHFEngine",
                            config="trainer_support:SleepyHFEngineConfig"))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl``."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
