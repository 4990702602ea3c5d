"""The ``substring_bench`` env of ``bench/vs_trl.py``: 16 one-turn questions, reward 1 for a known word.

The same prompts and reward feed TRL's ``GRPOTrainer`` (:func:`substring_reward`) and our
``fsdp_grpo`` (registered at run time as a plugin: this module holds the ``@hookimpl`` functions).
The plugin also records, per step, the token counts of the rollouts (``on_rollout_end``) and the
trainer's metrics (``on_train_step_end``) into :data:`STEPS`, for the benchmark's compute floors.
"""

from __future__ import annotations

from typing import Any

from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl

# (instruction, word a good answer contains), checked case-insensitively.
PROMPTS: list[tuple[str, str]] = [
    ("Name the largest planet in the solar system.", "jupiter"),
    ("What is the capital of France?", "paris"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("What color is the sky on a clear day?", "blue"),
    ("What is frozen water called?", "ice"),
    ("Which planet is known as the red planet?", "mars"),
    ("What is the opposite of hot?", "cold"),
    ("Which gas do plants absorb from the air? Give its name.", "carbon"),
    ("What do bees make?", "honey"),
    ("What is the capital of Japan?", "tokyo"),
    ("How many legs does a spider have? Answer in words.", "eight"),
    ("What is the largest ocean on Earth?", "pacific"),
    ("Which star is at the center of our solar system?", "sun"),
    ("What language is mainly spoken in Brazil?", "portuguese"),
    ("Which metal is liquid at room temperature?", "mercury"),
    ("What is the first month of the year?", "january"),
]

ENV_ID = "substring_bench"
# One dict per finished train step: prefill/generated/train token counts plus the trainer's metrics.
STEPS: list[dict[str, Any]] = []
_current = {"prefill_tokens": 0, "generated_tokens": 0, "train_tokens": 0, "episodes": 0}


def substring_reward(completion_text: str, word: str) -> float:
    return 1.0 if word.lower() in completion_text.lower() else 0.0


class SubstringEnv(TextEnv):
    """One turn: answer the question; reward 1 if the answer contains the task's word."""

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.task["prompt"]}]

    def take_action(self, action: str) -> StepResult:
        reward = substring_reward(action, self.task["word"])
        return StepResult([], reward, True, False, {"correct": reward > 0})

    def gold_actions(self) -> list[str]:
        return [f"The answer is {self.task['word']}."]

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "prompt": p, "word": w} for i, (p, w) in enumerate(PROMPTS)]


@hookimpl
def register_envs(register):
    register(EnvSpec(id=ENV_ID, entry_point=f"{__name__}:SubstringEnv",
                     description="bench/vs_trl.py: answer contains a known word", max_turns=1,
                     reward_range=(0.0, 1.0)))


@hookimpl
def on_rollout_end(trajectory):
    _current["prefill_tokens"] += len(trajectory.prompt_ids)
    _current["generated_tokens"] += trajectory.num_generated_tokens
    _current["train_tokens"] += len(trajectory.prompt_ids) + len(trajectory.response_ids)
    _current["episodes"] += 1


@hookimpl
def on_train_step_end(step, metrics):
    STEPS.append({"step": step, **_current, "metrics": dict(metrics)})
    for key in _current:
        _current[key] = 0
