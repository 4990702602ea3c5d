"""skyrl-reverse-text: the tutorial plugin, a worked example of a third-party SkyRL environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, hookimpl

if TYPE_CHECKING:
    from skyrl_core.probe import Probe


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="reverse_text",
        entry_point="skyrl_reverse_text.env:ReverseTextEnv",
        config="skyrl_reverse_text.env:ReverseTextConfig",
        description="Reverse a short string; answer inside <answer></answer>; retries allowed.",
        max_turns=2,
        reward_range=(0.0, 1.0),
        eval_splits={"train": "test"},  # the split a run evaluates on, and `skyrl rollout` plays by default
    ))


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    """A hostile policy of our own for `skyrl check reverse_text --adversarial` (the checker's import, kept lazy)."""
    from skyrl_core.probe import Probe

    register(Probe("unreversed", lambda turn: f"<answer>{turn.prompt[-1]['content']}</answer>",
                   "the user's text sent back as it is, not reversed, in <answer> on every turn; flagged when it "
                   "beats one honest wrong answer: the check compares the characters but not their order",
                   bar="wrong", env="reverse_text"))
