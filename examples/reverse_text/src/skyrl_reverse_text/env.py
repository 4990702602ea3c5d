"""A deterministic multi-turn env: the model must reverse a string.

Action format: ``<answer>reversed text</answer>``. A correct answer ends the episode with reward
1.0. A wrong or malformed answer gets feedback and another try until ``max_turns``.

The generator sums the rewards of an episode's turns, so the episode's reward is paid once, on the
turn that ends it: earlier tries score 0, and a wrong answer on the last try scores the fraction of
leading characters it got right, scaled by ``partial_credit``. (Paying partial credit on every try
would let a deliberately wrong first answer plus a right second one score 1.4, above the declared
``reward_range`` of (0, 1): a policy would learn to do exactly that.)
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field
from skyrl_core import EnvConfig, StepResult, TextEnv

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean", "maple", "robot",
         "sugar", "candle", "forest", "silver", "planet", "garden")
SYSTEM = ("Reverse the user's text character by character. Reply with the reversed text inside "
          "<answer></answer> tags and nothing else.")


class ReverseTextConfig(EnvConfig):
    max_turns: int = Field(2, ge=1, description="Tries per task; the episode is truncated after this many.")
    partial_credit: float = Field(0.5, ge=0.0, le=1.0, description="Weight of prefix credit for wrong answers.")
    dataset_size: int = Field(64, ge=1, description="Rows in the built-in dataset (per split).")


class ReverseTextEnv(TextEnv):
    config_class = ReverseTextConfig
    config: ReverseTextConfig

    def build_prompt(self) -> list[dict[str, str]]:
        text = self.task.get("text")
        if not isinstance(text, str) or not text:
            raise ValueError("reverse_text task needs a non-empty 'text' field")
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]

    def take_action(self, action: str) -> StepResult:
        target = self.task["text"][::-1]
        match = ANSWER.search(action)
        if match is None:
            feedback = "Put your answer inside <answer></answer> tags."
            return StepResult([{"role": "user", "content": feedback}], 0.0, False, False, {"format_ok": False})
        answer = match.group(1).strip()
        if answer == target:
            return StepResult([], 1.0, True, False, {"format_ok": True, "correct": True})
        prefix = next((i for i, (a, b) in enumerate(zip(answer, target, strict=False)) if a != b), min(len(answer), len(target)))
        last_try = self.turn >= self.max_turns
        reward = self.config.partial_credit * prefix / len(target) if last_try else 0.0
        feedback = f"Not quite: the first {prefix} characters are right. Try again."
        return StepResult([{"role": "user", "content": feedback}], reward, False, False,
                          {"format_ok": True, "correct": False})

    def gold_actions(self) -> list[str]:
        return [f"<answer>{self.task['text'][::-1]}</answer>"]

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> list[dict[str, Any]]:
        size = config.dataset_size if isinstance(config, ReverseTextConfig) else ReverseTextConfig().dataset_size
        rng = random.Random(f"reverse_text-{split}")
        return [{"id": f"{split}-{i}", "text": " ".join(rng.sample(WORDS, rng.randint(1, 2)))} for i in range(size)]
