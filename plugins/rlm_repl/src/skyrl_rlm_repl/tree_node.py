"""One episode of an ``rlm_tree`` rollout tree: the node type shared by the generator and its metrics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from skyrl_core import Trajectory

from skyrl_rlm_repl.budget import RolloutBudget


@dataclass(eq=False)
class TreeNode:
    """One episode of a rollout tree."""

    trajectory: Trajectory
    budget: RolloutBudget
    root_id: str
    frozen: bool = False
    key: str = ""
    """The node's place in the batch (``"<group id>/<sample>"``, ``"<parent key>/c<child index>"``): the
    requests it sends are seeded from it (see :func:`~skyrl_core.generator.request_seed`)."""
    context: Any = None
    sub_calls: int = 0
    children: list[TreeNode] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return self.trajectory.depth

    def descendants(self) -> Iterator[TreeNode]:
        """Children depth-first, each before its own children, in call order."""
        for child in self.children:
            yield child
            yield from child.descendants()
