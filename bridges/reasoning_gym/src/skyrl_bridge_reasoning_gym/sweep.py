"""Catalogue sweep: make every dataset's first row, build its prompt and play its gold answer.

``python -m skyrl_bridge_reasoning_gym.sweep`` prints one line per dataset and the counts: how many make, how
many have a gold answer, how many score their own gold answer below 1, which fail and why.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from typing import Any

from skyrl_bridge_reasoning_gym import peer

SWEEP_ARGS: dict[str, dict[str, Any]] = {
    peer.COMPOSITE: {"datasets": [{"name": "chain_sum", "weight": 1}, {"name": "spell_backward", "weight": 1}]},
}
"""Options a dataset needs to be made at all (composite mixes datasets you name)."""


@dataclass
class SweepResult:
    name: str
    made: bool = False
    has_gold: bool = False
    ceiling: float | None = None
    gold_reward: float | None = None
    open_ended: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.made and not self.problems


def sweep_one(name: str) -> SweepResult:
    from skyrl_bridge_reasoning_gym.env import ReasoningGymEnv

    result = SweepResult(name)
    state = random.getstate()
    try:
        config = ReasoningGymEnv.config_class(name=name, args={**SWEEP_ARGS.get(name, {}), "size": 1})
        (row,) = ReasoningGymEnv.load_dataset("train", config)
        env = ReasoningGymEnv(task=row, config=config)
        prompt, _ = env.reset(seed=0, options={"task": row})
        if not (prompt and all(isinstance(m.get("content"), str) and m["content"] for m in prompt)):
            result.problems.append("the prompt is empty")
        result.made = True
        result.open_ended = row["answer"] is None
        gold = env.gold_actions()
        result.has_gold = bool(gold)
        result.ceiling = env.reward_ceiling()
        if gold:
            reward = sum(env.step(action).reward for action in gold)
            result.gold_reward = reward
            if abs(reward - result.ceiling) > 1e-9:
                result.problems.append(f"the gold answer scored {reward:g}, not its ceiling {result.ceiling:g}")
        elif not result.open_ended:
            result.problems.append(f"the dataset's own answer scores {env.gold_score()!r}: no gold")
        env.close()
    except Exception as exc:  # noqa: BLE001 - every dataset is reported
        result.problems.append(f"{type(exc).__name__}: {exc}"[:500])
    if random.getstate() != state:
        result.problems.append("the global random state changed")
    return result


def sweep(names: list[str] | None = None) -> list[SweepResult]:
    return [sweep_one(name) for name in (names or peer.dataset_names())]


def summary(results: list[SweepResult]) -> dict[str, Any]:
    return {
        "datasets": len(results),
        "made": sum(r.made for r in results),
        "with_gold": sum(r.has_gold for r in results),
        "open_ended": sorted(r.name for r in results if r.open_ended),
        "gold_below_1": sorted(r.name for r in results if r.has_gold and (r.ceiling or 0) < 1.0),
        "failed": {r.name: r.problems for r in results if not r.ok},
    }


def main() -> int:
    results = sweep(sys.argv[1:] or None)
    for r in results:
        status = "ok" if r.ok else "FAIL " + "; ".join(r.problems)
        print(f"{r.name:28s} gold={r.has_gold!s:5s} ceiling={r.ceiling!s:6s} {status}")
    totals = summary(results)
    print(totals)
    return 0 if not totals["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
