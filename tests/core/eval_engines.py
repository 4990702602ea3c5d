"""Engine ``answers`` for the ``skyrl eval`` tests (a plugin module: the tests load it into a ``skyrl``
subprocess with ``SKYRL_PLUGIN_MODULES=eval_engines``).

It plays reverse_text with known results: the first ``right[text]`` episodes of a task whose text is
``text`` answer right (reward 1), every later one answers with the last character wrong, which a
one-turn episode scores ``0.5 * (len - 1) / len`` (reverse_text's partial credit on a last try). Which
episode of a task comes first depends on asyncio's order, but how many answer right does not, and that
is all pass@k and mean@k depend on.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field
from skyrl_core import EngineSpec, hookimpl
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer


class AnswersConfig(BaseModel):
    model: str = "chatml"
    right: dict[str, int] = Field(default_factory=dict, description="task text -> episodes that answer right")


class AnswersEngine(ScriptedEngine):
    def __init__(self, config: AnswersConfig) -> None:
        super().__init__(make_tokenizer(config.model), default=self.reply)
        self.right = dict(config.right)
        self.asked: Counter[str] = Counter()

    def reply(self, prompt_ids: list[int]) -> str:
        prompt = self.tokenizer.decode(prompt_ids)
        text = prompt.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        self.asked[text] += 1
        target = text[::-1]
        if self.asked[text] <= self.right.get(text, 0):
            return f"<answer>{target}</answer>"
        return f"<answer>{target[:-1]}{'y' if target.endswith('x') else 'x'}</answer>"


@hookimpl
def register_inference_engines(register: Any) -> None:
    register(EngineSpec(id="answers", entry_point="eval_engines:AnswersEngine", config="eval_engines:AnswersConfig",
                        description="reverse_text answered right a known number of times per task (tests)"))
