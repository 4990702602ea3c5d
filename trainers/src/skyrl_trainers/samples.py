"""What ``samples.jsonl`` keeps of a step: a spread of root episodes, each followed by its tree.

Child episodes (rlm_tree sub-calls, linked by ``parent_id``) come right after their parent, depth-first,
so a viewer can draw the tree; the env's sub-call limits bound a tree's size. Each record gets
``metrics.train_step`` and, unless it is left out of the loss, ``metrics.advantage``: the value the
update trained on, handed in by the trainer rather than computed again here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from skyrl_core.trajectory import Trajectory, write_jsonl

from skyrl_trainers.credit import episode_key


def write_samples(path: Path, step: int, trajectories: Sequence[Trajectory], advantages: Sequence[float | None],
                  count: int) -> None:
    """Append ``count`` root episodes of the batch (with their trees) to ``path``; ``advantages`` line up
    with ``trajectories``."""
    chosen = sampled(trajectories, count)
    for index in chosen:
        trajectories[index].metrics["train_step"] = float(step)
        advantage = advantages[index]
        if advantage is not None:
            trajectories[index].metrics["advantage"] = float(advantage)
    if chosen:
        write_jsonl(path, [trajectories[i] for i in chosen], append=True)


def sampled(trajectories: Sequence[Trajectory], count: int) -> list[int]:
    """Indexes of ``count`` root episodes spread over the batch, each before its child episodes, in call order
    (every record of a step-wise episode)."""
    if not count:
        return []
    episodes: dict[str, list[int]] = {}  # episode -> its records (several in step-wise mode)
    children: dict[str, list[str]] = {}
    for index, t in enumerate(trajectories):
        key = episode_key(t)
        if key not in episodes and t.parent_id is not None:
            children.setdefault(t.parent_id, []).append(key)
        episodes.setdefault(key, []).append(index)
    roots = [key for key, records in episodes.items() if trajectories[records[0]].parent_id is None]
    stride = max(1, len(roots) // count)
    chosen: list[int] = []
    pending = roots[::stride][:count][::-1]
    while pending:  # depth-first, each episode before its children, in call order
        key = pending.pop()
        chosen.extend(episodes[key])
        pending.extend(reversed(children.get(key, [])))
    return chosen
