"""Small envs and plugins used by the core tests (importable because pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

from skyrl_core import EngineSpec, EnvConfig, EnvSpec, StepResult, TextEnv, hookimpl


class CountdownEnv(TextEnv):
    """Asks for a number each turn; reward 1.0 when the model says 'done' (0 for the turns before it)."""

    config_class = EnvConfig

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": "Count."}, {"role": "user", "content": f"Start at {self.task['n']}"}]

    def take_action(self, action: str) -> StepResult:
        if "done" in action:
            return StepResult([], 1.0, True, False, {})
        return StepResult([{"role": "user", "content": f"turn {self.turn}: go on"}], 0.0, False, False, {})

    def gold_actions(self) -> list[str]:
        return ["done"]

    def get_metrics(self) -> dict[str, float]:
        return {"turns_seen": float(self.turn)}

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": f"c{i}", "n": i} for i in range(4)]


class CrashingEnv(CountdownEnv):
    """Raises inside ``reset`` for the task with ``crash: True``."""

    def build_prompt(self) -> list[dict[str, str]]:
        if self.task.get("crash"):
            raise RuntimeError("database unavailable")
        return super().build_prompt()


class TestEnvsPlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="countdown", entry_point="core_envs:CountdownEnv", max_turns=3,
                         description="test env"))
        register(EnvSpec(id="crashing", entry_point="core_envs:CrashingEnv", description="crashes on demand"))


class ScriptedEnginePlugin:
    """Registers engine ``scripted`` replaying ``<answer>...</answer>`` for the reverse_text task."""

    @hookimpl
    def register_inference_engines(self, register):
        register(EngineSpec(id="scripted", entry_point="core_envs:make_scripted_engine",
                            config="core_envs:ScriptedEngineConfig", description="test engine"))


from pydantic import BaseModel  # noqa: E402


class ScriptedEngineConfig(BaseModel):
    model: str = "chatml"
    reply: str = "<answer>wrong</answer>"


def make_scripted_engine(config: ScriptedEngineConfig) -> Any:
    from skyrl_core.testing.scripted_engine import ScriptedEngine
    from skyrl_core.testing.tokenizers import make_tokenizer

    return ScriptedEngine(make_tokenizer(config.model), default=config.reply)
