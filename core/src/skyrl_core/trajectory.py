"""Plain, serialisable rollout records: turns, trajectories (nodes of a rollout tree) and batches.

Token-level fields line up: ``len(response_ids) == len(loss_mask) == len(logprobs)``. Generated
tokens have mask 1 and the engine's logprob; observation tokens have mask 0 and logprob 0.0.
``policy_versions`` lines up too where the generator records it (the default one does): the policy
version (engine ``weight_version``) that produced each generated token, -1 for observation tokens
and unknown versions; it is empty in records from generators that do not record versions.
``Turn.token_source`` says whether generated ids are exact, re-tokenised or chat-mode text;
``Trajectory.trainable`` is false for the last (trainers refuse them).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class Turn:
    """One model action and what the env answered."""

    action: str
    observation: list[dict[str, str]]
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    generated_tokens: int = 0
    observation_tokens: int = 0
    engine_stop_reason: str | None = None
    token_source: str = "exact"
    """Where the turn's generated ids come from (the engine output's ``metadata["token_source"]``):
    ``exact`` (the ids the model sampled), ``retokenized`` (the server's text re-encoded with a
    tokenizer: may differ from what was sampled, no logprobs) or ``text`` (an engine in chat mode:
    characters, not model tokens)."""


DERIVED_FIELDS = ("token_source", "trainable")
"""Keys :meth:`Trajectory.to_dict` adds from its turns; :meth:`Trajectory.from_dict` ignores them."""


@dataclass
class Trajectory:
    """One episode. ``parent_id``/``depth`` place it in a tree of rollouts (``None``/0 for roots).

    ``group_id`` ties together the samples of one task (a GRPO group); ``step_index`` is set when
    the trajectory is one turn of a step-wise episode.
    """

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    """Policy version of each token of ``response_ids`` (-1: observation token or unknown); empty
    when the generator records no versions. A trajectory may span versions when weights are updated
    mid-episode (between turns, or in flight on an engine with ``in_flight_updates``)."""
    reward: float = 0.0
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str = "unknown"
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    parent_id: str | None = None
    depth: int = 0
    group_id: str = ""
    sample_index: int = 0
    env_id: str = ""
    task: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    step_index: int | None = None
    is_last_step: bool = True
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    env_node: str | None = None
    reward_ceiling: float | None = None
    """The best reward the task can reach where the env declares it below the top of its range (``reset``'s
    ``info["reward_ceiling"]``): pass rates count an episode that reaches it as passed."""
    """The Ray node whose env worker ran the episode's env (``generator.env_placement=ray``); ``None``
    when the env ran in the generator's own process."""

    @property
    def rewards(self) -> list[float]:
        """Per-turn rewards."""
        return [t.reward for t in self.turns]

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_policy_version(self) -> int | None:
        """The oldest known policy version among its tokens (``None`` when no version is known)."""
        return min((v for v in self.policy_versions if v >= 0), default=None)

    @property
    def token_source(self) -> str:
        """The least exact ``token_source`` of its turns: ``text``, else ``retokenized``, else ``exact``."""
        sources = {t.token_source for t in self.turns}
        return next((s for s in ("text", "retokenized") if s in sources), "exact")

    @property
    def trainable(self) -> bool:
        """Whether the ids are model tokens a trainer can learn from (not chat-mode text)."""
        return self.token_source != "text"

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus the derived :attr:`token_source` and :attr:`trainable` (so a JSONL reader
        sees them without recomputing; :meth:`from_dict` recomputes them from the turns)."""
        return {**asdict(self), "token_source": self.token_source, "trainable": self.trainable}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k not in DERIVED_FIELDS}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown trajectory field(s): {sorted(unknown)}")
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        return cls(**data)


@dataclass
class TrajectoryBatch:
    """The output of one generator call, in input order (children after their roots)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def roots(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.parent_id is None]

    def children_of(self, trajectory_id: str) -> list[Trajectory]:
        return [t for t in self.trajectories if t.parent_id == trajectory_id]

    def to_jsonl(self, path: str | Path) -> None:
        write_jsonl(path, self.trajectories)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> TrajectoryBatch:
        return cls(list(read_jsonl(path)))


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory], append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{line_number}: not a trajectory record: {exc}") from exc
