"""Batch metrics of rollout trees, per depth: episodes, sub-calls, rewards, sandbox errors and timeouts.

Keys: ``rlm/depth{d}/episodes|reward_mean|sub_calls|sandbox_errors|sandbox_timeouts|final_answer_rate``
(``sub_calls``: prompts sent by REPLs at that depth, refused ones included)
and per rollout ``rlm/depth_reached_mean|max``, ``rlm/sub_calls_mean``, ``rlm/tokens_mean``,
``rlm/refusals``; with a judge, ``rlm/judge_score_mean`` and ``rlm/judge_failures``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl_rlm_repl.tree_node import TreeNode

_SUMMED = ("sandbox_errors", "sandbox_timeouts")


def tree_metrics(roots: Sequence[TreeNode]) -> dict[str, float]:
    if not roots:
        return {}
    by_depth: dict[int, list[TreeNode]] = defaultdict(list)
    reached = []
    for root in roots:
        nodes = [root, *root.descendants()]
        reached.append(max(n.depth for n in nodes))
        for node in nodes:
            by_depth[node.depth].append(node)
    out: dict[str, float] = {}
    for depth, nodes in sorted(by_depth.items()):
        prefix = f"rlm/depth{depth}/"
        out[prefix + "episodes"] = float(len(nodes))
        out[prefix + "reward_mean"] = sum(n.trajectory.reward for n in nodes) / len(nodes)
        out[prefix + "final_answer_rate"] = sum(n.trajectory.metrics.get("final_answer_given", 0.0)
                                                for n in nodes) / len(nodes)
        out[prefix + "sub_calls"] = float(sum(n.sub_calls for n in nodes))
        for key in _SUMMED:
            out[prefix + key] = sum(n.trajectory.metrics.get(key, 0.0) for n in nodes)
    out["rlm/depth_reached_mean"] = sum(reached) / len(reached)
    out["rlm/depth_reached_max"] = float(max(reached))
    out["rlm/sub_calls_mean"] = sum(r.budget.sub_calls for r in roots) / len(roots)
    out["rlm/tokens_mean"] = sum(r.budget.tokens for r in roots) / len(roots)
    out["rlm/refusals"] = float(sum(r.budget.refusals for r in roots))
    judged = [r.trajectory.metrics["judge_score"] for r in roots if "judge_score" in r.trajectory.metrics]
    failed = sum(r.trajectory.metrics.get("judge_failed", 0.0) for r in roots)
    if judged or failed:
        out["rlm/judge_score_mean"] = sum(judged) / len(judged) if judged else 0.0
        out["rlm/judge_failures"] = float(failed)
    return out
