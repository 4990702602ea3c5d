"""Optional LLM judge for evidence answers, mixed into the deterministic F1 by ``rlm_tree``.

The judge sees the question, the gold evidence and the returned snippets and answers with a score
from 0 to 10. It complements F1 (which cannot tell a near-miss from an irrelevant quote) but never
replaces the grounding check: ungrounded snippets are removed before the judge sees the answer, so
a persuasive invented quote cannot earn judge credit. A judge failure is logged and counted, and
the episode keeps its F1 reward; it never becomes a silent 0.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

PROMPT = """\
You grade evidence selection. Question:
{question}

Gold evidence (what a perfect answer quotes):
{gold}

Returned snippets:
{predicted}

Score the returned snippets from 0 to 10: 10 when they cover all the gold evidence and nothing \
irrelevant, 0 when they miss it entirely. Reply with one line: SCORE: <integer 0-10>"""
_SCORE = re.compile(r"SCORE:\s*(\d{1,2})\b", re.IGNORECASE)


class ChatEngine(Protocol):
    async def chat(self, messages: Sequence[dict[str, str]], **sampling: Any) -> str: ...


def judge_prompt(question: str, gold: Sequence[str], predicted: Sequence[str]) -> str:
    def numbered(items: Sequence[str]) -> str:
        return "\n".join(f"[{i}] {s}" for i, s in enumerate(items, 1)) or "(none)"

    return PROMPT.format(question=question, gold=numbered(gold), predicted=numbered(predicted))


def parse_judge_score(text: str) -> float | None:
    """The score in [0, 1] from a ``SCORE: n`` line, or ``None`` when there is no valid one."""
    match = _SCORE.search(text)
    if match is None or int(match.group(1)) > 10:
        return None
    return int(match.group(1)) / 10


class EvidenceJudge:
    """Asks a chat engine (e.g. core's ``openai`` engine) to score an evidence answer."""

    def __init__(self, engine: ChatEngine, max_tokens: int = 64) -> None:
        if not callable(getattr(engine, "chat", None)):
            raise TypeError(f"the judge engine needs a chat() method (core's 'openai' engine has one), "
                            f"got {type(engine).__name__}")
        self.engine = engine
        self.max_tokens = max_tokens

    async def score(self, question: str, gold: Sequence[str], predicted: Sequence[str]) -> float | None:
        """The judge's score in [0, 1], or ``None`` when the call or its reply failed."""
        prompt = judge_prompt(question, gold, predicted)
        try:
            reply = await self.engine.chat([{"role": "user", "content": prompt}], temperature=0.0,
                                           max_tokens=self.max_tokens)
        except Exception:  # noqa: BLE001 - a judge outage must not take the episode down
            log.warning("evidence judge call failed", exc_info=True)
            return None
        score = parse_judge_score(reply)
        if score is None:
            log.warning("evidence judge reply has no 'SCORE: n' line: %.200r", reply)
        return score
