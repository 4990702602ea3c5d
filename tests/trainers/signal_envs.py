"""Two one-turn envs for the no-signal tests, registered as a module plugin (``SKYRL_PLUGIN_MODULES=signal_envs``)
so that a ``skyrl run`` subprocess can use them.

* ``constant_reward``: every reply scores 0.5, so every GRPO group has zero reward variance.
* ``varied_reward``: the score is a hash of the reply's characters, so samples of a task differ.
"""

from __future__ import annotations

from typing import Any

from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl


class ConstantRewardEnv(TextEnv):
    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Say anything ({self.task['id']})."}]

    def take_action(self, action: str) -> StepResult:
        return StepResult([], 0.5, True, False, {})

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": f"t{i}"} for i in range(4)]


class VariedRewardEnv(ConstantRewardEnv):
    def take_action(self, action: str) -> StepResult:
        return StepResult([], (sum(map(ord, action)) % 7) / 6, True, False, {})


@hookimpl
def register_envs(register):
    register(EnvSpec(id="constant_reward", entry_point="signal_envs:ConstantRewardEnv", max_turns=1,
                     description="every reply scores 0.5"))
    register(EnvSpec(id="varied_reward", entry_point="signal_envs:VariedRewardEnv", max_turns=1,
                     description="a hash of the reply"))
