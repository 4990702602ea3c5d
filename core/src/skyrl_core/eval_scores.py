"""The scores of `skyrl eval`: which episodes pass, pass@k and mean@k per task and over the tasks.

An episode *passes* when its reward reaches the top of the env's ``reward_range`` (the reward of a
solved task), or a threshold the user gives; an episode that ended in an infrastructure error never
passes. pass@k is the unbiased estimate from ``n >= k`` samples of which ``c`` pass,
``1 - C(n - c, k) / C(n, k)``: the chance that at least one of ``k`` samples drawn without
replacement from the ``n`` passes. It is computed for ``k`` = 1, 2, 4, ... up to the samples per task
(and that number itself). mean@k is a task's mean reward over its samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_core.oracle import task_name
from skyrl_core.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` pass: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k holds a passing sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_ks(samples: int) -> list[int]:
    """The k of the pass@k columns: 1, 2, 4, ... below ``samples``, then ``samples``."""
    ks = [1 << i for i in range(samples.bit_length()) if 1 << i < samples]
    return [*ks, samples] if samples >= 1 else []


def passes(trajectory: Trajectory, threshold: float, *, ceilings: bool = False) -> bool:
    """Whether an episode counts as solved: no error and a reward of at least ``threshold`` (less a relative
    1e-6, as ``eval/pass_rate`` of a run's evaluations: a reward summed over turns, 0.1 + 0.2 + 0.7, may miss
    1.0 by a rounding error). With ``ceilings`` the bar is the task's own ceiling where it is lower (a game
    that cannot be won outright on every deal)."""
    if ceilings and trajectory.reward_ceiling is not None:
        threshold = min(threshold, trajectory.reward_ceiling)
    return trajectory.error is None and trajectory.reward >= threshold - 1e-6 * max(1.0, abs(threshold))


@dataclass
class TaskScore:
    """One task's episodes: their rewards, which passed, and how many ended in an error."""

    task: str
    index: int
    rewards: list[float] = field(default_factory=list)
    passed: list[bool] = field(default_factory=list)
    errors: int = 0

    @property
    def n(self) -> int:
        return len(self.rewards)

    @property
    def c(self) -> int:
        return sum(self.passed)

    @property
    def mean(self) -> float | None:
        return sum(self.rewards) / self.n if self.n else None

    def pass_at(self, k: int) -> float | None:
        """pass@k of this task, ``None`` when it has fewer than ``k`` episodes (some were dropped)."""
        return pass_at_k(self.n, self.c, k) if self.n >= k else None


def episodes_of(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The root episodes of a batch (one record each, also in step-wise mode), in batch order."""
    return [t for t in trajectories if t.parent_id is None and t.is_last_step]


def score_tasks(rows: Sequence[Mapping[str, Any]], episodes: Sequence[Trajectory], threshold: float,
                samples: int, *, ceilings: bool = False) -> list[TaskScore]:
    """One :class:`TaskScore` per row, in row order; ``ceilings`` as in :func:`passes`.

    Episodes find their row by group id (the row's ``id``, else its position, as the generator sets
    it); rows that share an id take that id's episodes in batch order, ``samples`` each.
    """
    scores = [TaskScore(task_name(row, index), index) for index, row in enumerate(rows)]
    by_group: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_group.setdefault(str(row.get("id", index)), []).append(index)
    seen: dict[str, int] = {}
    for episode in episodes:
        indices = by_group.get(episode.group_id)
        if not indices:
            continue
        count = seen[episode.group_id] = seen.get(episode.group_id, 0) + 1
        score = scores[indices[min((count - 1) // max(samples, 1), len(indices) - 1)]]
        score.rewards.append(episode.reward)
        score.passed.append(passes(episode, threshold, ceilings=ceilings))
        score.errors += episode.error is not None
    return scores


def eval_metrics(scores: Sequence[TaskScore], ks: Sequence[int], samples: int) -> dict[str, float]:
    """``eval/pass@k`` for each k and ``eval/mean@<samples>``: means over the tasks that have the episodes."""
    metrics: dict[str, float] = {}
    for k in ks:
        values = [v for v in (s.pass_at(k) for s in scores) if v is not None]
        if values:
            metrics[f"eval/pass@{k}"] = sum(values) / len(values)
    means = [s.mean for s in scores if s.mean is not None]
    if means:
        metrics[f"eval/mean@{samples}"] = sum(means) / len(means)
    metrics["eval/tasks"] = float(len(scores))
    return metrics


def task_rows(scores: Sequence[TaskScore], ks: Sequence[int], samples: int) -> list[dict[str, Any]]:
    """The per-task table as plain rows (``per_task.json`` and the console table)."""
    return [{"task": s.task, "n": s.n, "passed": s.c, **{f"pass@{k}": s.pass_at(k) for k in ks},
             f"mean@{samples}": s.mean, "errors": s.errors, "rewards": list(s.rewards)} for s in scores]
