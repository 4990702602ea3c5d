"""Named, weighted reward functions whose components are reported in ``info``.

    rubric = Rubric(RewardFn("correct", exact_match, weight=1.0), RewardFn("format", has_tags, weight=0.1))
    total, components = rubric.score(response=text, task=task)
    info["reward_components"] = components
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RewardFn:
    """A reward component: ``fn(**context) -> float`` scaled by ``weight``."""

    name: str
    fn: Callable[..., float]
    weight: float = 1.0


class Rubric:
    """A weighted sum of reward components."""

    def __init__(self, *components: RewardFn) -> None:
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}")
        self.components = components

    def score(self, **context: Any) -> tuple[float, dict[str, float]]:
        """Total weighted reward and the unweighted value of each component."""
        values = {c.name: float(c.fn(**context)) for c in self.components}
        total = sum(c.weight * values[c.name] for c in self.components)
        return total, values
