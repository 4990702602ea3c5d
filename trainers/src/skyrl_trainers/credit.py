"""Assign one advantage to every trajectory of a batch: plain groups, step-wise episodes and trees.

* An *episode* is one played trajectory; in step-wise mode it is split into steps (``step_index`` set)
  that share the episode's reward, and its score is read from its last step.
* Root episodes (``parent_id is None``) with the same ``group_id`` form an estimator group.
* Tree children (``parent_id`` set) follow ``child_advantage``: ``inherit`` their root's advantage,
  compute their ``own`` within groups of the same task and depth, or ``exclude`` them from the loss.
* Episodes with ``error`` set or without generated tokens are not trained on and do not enter any
  baseline: an infrastructure failure says nothing about the policy.

Every step of an episode receives the episode's advantage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from skyrl_core.trajectory import Trajectory

from skyrl_trainers.algorithms import ADVANTAGE_ESTIMATORS


@dataclass
class _Episode:
    key: str
    parent_key: str | None
    group_id: str
    depth: int
    steps: list[int] = field(default_factory=list)
    score: float = 0.0
    trainable: bool = True


def episode_key(trajectory: Trajectory) -> str:
    """The id of the episode a trajectory belongs to (step-wise samples are ``<episode id>-s<i>``)."""
    suffix = f"-s{trajectory.step_index}"
    if trajectory.step_index is not None and trajectory.id.endswith(suffix):
        return trajectory.id[: -len(suffix)]
    return trajectory.id


def assign_advantages(trajectories: Sequence[Trajectory], *, estimator: str = "grpo", norm_by_std: bool = True,
                      child_advantage: str = "inherit") -> list[float | None]:
    """One advantage per trajectory, in order; ``None`` means "do not train on this one"."""
    episodes = _episodes(trajectories)
    roots = [e for e in episodes.values() if e.parent_key not in episodes]  # None is never a key
    children = [e for e in episodes.values() if e.parent_key in episodes]
    advantage: dict[str, float | None] = {}
    _estimate(roots, lambda e: e.group_id, estimator, norm_by_std, trajectories, advantage)
    if child_advantage == "own":
        _estimate(children, lambda e: f"{e.group_id}/depth{e.depth}", estimator, norm_by_std, trajectories, advantage)
    for child in children:
        if not child.trainable or child_advantage == "exclude":
            advantage[child.key] = None
        elif child_advantage == "inherit":
            advantage[child.key] = advantage.get(_root_of(child, episodes).key)
    out: list[float | None] = [None] * len(trajectories)
    for episode in episodes.values():
        for index in episode.steps:
            out[index] = advantage.get(episode.key)
    return out


def group_scores(trajectories: Sequence[Trajectory]) -> dict[str, list[float]]:
    """The scores of the trainable root episodes of each estimator group (``group_id``), in batch order:
    what a group-relative estimator compares (failed and empty episodes left out, as in the baseline)."""
    episodes = _episodes(trajectories)
    groups: dict[str, list[float]] = {}
    for e in episodes.values():
        if e.parent_key not in episodes and e.trainable:
            groups.setdefault(e.group_id, []).append(e.score)
    return groups


def _episodes(trajectories: Sequence[Trajectory]) -> dict[str, _Episode]:
    episodes: dict[str, _Episode] = {}
    for index, t in enumerate(trajectories):
        key = episode_key(t)
        episode = episodes.setdefault(key, _Episode(key, t.parent_id, t.group_id, t.depth))
        episode.steps.append(index)
        if t.error is not None:
            episode.trainable = False
    for episode in episodes.values():
        steps = [trajectories[i] for i in episode.steps]
        last = next((t for t in steps if t.is_last_step), max(steps, key=lambda t: t.step_index or 0))
        episode.score = last.reward
        if not any(sum(t.loss_mask) for t in steps):
            episode.trainable = False
    return episodes


def _root_of(episode: _Episode, episodes: dict[str, _Episode]) -> _Episode:
    seen = set()
    while episode.parent_key in episodes and episode.key not in seen:
        seen.add(episode.key)
        episode = episodes[episode.parent_key]
    return episode


def _estimate(episodes: list[_Episode], group_of: Callable[[_Episode], str], estimator: str, norm_by_std: bool,
              trajectories: Sequence[Trajectory], advantage: dict[str, float | None]) -> None:
    trainable = [e for e in episodes if e.trainable]
    for e in episodes:
        if not e.trainable:
            advantage[e.key] = None
    if not trainable:
        return
    names = {g: i for i, g in enumerate(dict.fromkeys(group_of(e) for e in trainable))}
    scores = torch.tensor([e.score for e in trainable], dtype=torch.float64)
    groups = torch.tensor([names[group_of(e)] for e in trainable])
    fn = ADVANTAGE_ESTIMATORS[estimator]
    if estimator == "grpo":
        values = fn(scores, groups, norm_by_std=norm_by_std)
    elif estimator == "reinforce_pp":
        tokens = torch.tensor([sum(sum(trajectories[i].loss_mask) for i in e.steps) for e in trainable])
        values = fn(scores, groups, num_tokens=tokens)
    else:
        values = fn(scores, groups)
    for e, value in zip(trainable, values.tolist(), strict=True):
        advantage[e.key] = value
