"""The reward of a final answer, chosen by what the task row holds.

* ``evidence`` (the built-in task): snippet F1 against the gold evidence, ungrounded snippets
  counting as misses (:mod:`skyrl_rlm_repl.evidence.reward`); 0 for an answer of more than
  ``MAX_SNIPPETS_PER_EVIDENCE`` snippets per gold snippet.
* ``answer``: 1.0 when the answer equals it up to case, spacing and punctuation, else 0.0.
* neither (a child episode started by ``rlm_query``, which has no gold): the fraction of returned
  snippets that really occur in its context, so a child's own reward says whether it quoted
  faithfully. ``child_advantage: own`` in the trainer uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_rlm_repl.evidence.reward import SourceIndex, match_key, parse_snippets, score_evidence

# Scoring cost grows with the answer: beyond these it is refused unscored (reward 0), so a huge or
# many-piece answer can neither stall the trainer nor buy matches by volume. An evidence answer may also
# hold at most MAX_SNIPPETS_PER_EVIDENCE snippets per gold snippet: every sentence of the papers, which
# a policy can return without reading the question, would otherwise earn F1 from recall alone (0.08 to
# 0.11 on the built-in tasks).
MAX_SCORED_CHARS = 100_000
MAX_SCORED_SNIPPETS = 200
MAX_SNIPPETS_PER_EVIDENCE = 4


def score_answer(task: Mapping[str, Any], context: Any, answer: str, threshold: float) -> tuple[float, dict[str, float]]:
    """``(reward, components)`` for ``answer`` to ``task``; components go to the step's info."""
    if len(answer) > MAX_SCORED_CHARS:
        return 0.0, {"answer_too_long": 1.0}
    if "evidence" in task:
        snippets, gold = parse_snippets(answer), list(task["evidence"])
        if len(snippets) > min(MAX_SCORED_SNIPPETS, MAX_SNIPPETS_PER_EVIDENCE * len(gold)):
            return 0.0, {"too_many_snippets": 1.0}
        score = score_evidence(snippets, gold, SourceIndex(context), threshold)
        return score.f1, score.as_dict()
    if "answer" in task:
        correct = float(match_key(answer) == match_key(str(task["answer"])))
        return correct, {"correct": correct}
    snippets = parse_snippets(answer)
    if not snippets or len(snippets) > MAX_SCORED_SNIPPETS:
        return 0.0, {"grounded_fraction": 0.0}
    source = SourceIndex(context)
    grounded = sum(source.contains(s) for s in snippets) / len(snippets)
    return grounded, {"grounded_fraction": grounded}
