"""What an adversarial probe is: :class:`Probe`, a scripted policy, and :class:`Turn`, what it knows before each
action. A leaf module beside the hookspecs: a plugin's ``register_probes`` hook builds these without importing the
checker that plays them (:func:`skyrl_core.testing.check_adversarial`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from skyrl_core.env import Message

_FORMAT_TOKEN = re.compile(r"</?[A-Za-z_][\w-]*/?>|```[\w-]*|\b[A-Z_]{3,}\(")


@dataclass(frozen=True)
class Turn:
    """What a probe knows before its next action."""

    number: int  # 1-based
    max_turns: int
    prompt: list[Message]
    observations: list[list[Message]]  # what each earlier action got back
    actions: list[str]  # the probe's earlier actions
    gold: list[str]  # the task's gold actions ([] when it has none): material for wrong actions only

    @property
    def last(self) -> bool:
        return self.number >= self.max_turns

    @property
    def shown(self) -> str:
        """The text the env showed last: the latest observation, else the prompt."""
        messages = self.observations[-1] if self.observations and self.observations[-1] else self.prompt
        return "\n".join(message["content"] for message in messages)

    def format_tokens(self) -> list[str]:
        """The env's own markup (tags, code fences, ``FINAL(``-style calls) as its prompt and gold use it."""
        text = "\n".join([*(m["content"] for m in self.prompt), *self.gold])
        return list(dict.fromkeys(_FORMAT_TOKEN.findall(text)))


@dataclass(frozen=True)
class Probe:
    """A scripted policy: ``act`` gives the action for each turn.

    ``about`` says what it tries and, when it is flagged, the usual fix. ``bar`` is what it must not
    beat: ``"null"`` (the default), the null agent's reward; ``"filler"``, that and also the episode
    it is made from (:data:`WRONG` every turn), for probes that change one reply of it (an empty
    reply that scores better than a wrong one dodged a penalty); ``"wrong"``, the reward of an
    honest wrong answer (the last gold action made wrong, on the last turn), for probes built from
    wrong answers in an env that gives partial credit; ``"gold"``, reaching the gold's full reward
    (for probes that do part of the work honestly, or answer almost right). ``env`` is the env id a
    plugin's probe is for (``None``: every env).
    """

    name: str
    act: Callable[[Turn], str]
    about: str
    needs_gold: bool = False
    bar: Literal["null", "filler", "wrong", "gold"] = "null"
    env: str | None = None
