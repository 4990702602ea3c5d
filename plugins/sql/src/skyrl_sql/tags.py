"""SkyRL-SQL's action format: ``<think>``, ``<sql>`` to run a query, ``<solution>`` to submit.

The episode's format is judged on the whole history (actions and observations concatenated), as
SkyRL-SQL does, so datasets and recipes trained against its rules carry over unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SQL_TAG = re.compile(r"<sql>(.*?)</sql>", re.DOTALL)
SOLUTION_TAG = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
_TAGS_BANNED_IN_SOLUTION = re.compile(r"</?(think|sql|observation)\b", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_OBSERVATION_END = re.compile(r"</observation>")


def has_solution(action: str) -> bool:
    """SkyRL-SQL ends the episode as soon as an action holds both solution tags."""
    return "<solution>" in action and "</solution>" in action


def first_query(action: str) -> str | None:
    """The first ``<sql>...</sql>`` body, stripped; ``None`` when there is none."""
    match = SQL_TAG.search(action)
    return match.group(1).strip() if match else None


@dataclass(frozen=True)
class FormatCheck:
    ok: bool
    solution: str | None
    problem: str = ""


def check_format(history: str, *, require_think: bool = True) -> FormatCheck:
    """Validate an episode's text and extract its submitted SQL.

    Valid when: exactly one ``<solution>`` followed by exactly one ``</solution>``; the solution
    holds no ``<think>``/``<sql>``/``<observation>`` tag; and, with ``require_think``, there is a
    ``<think>...</think>`` block and every ``</observation>`` before the solution is followed by
    ``<think>``.
    """
    if history.count("<solution>") != 1 or history.count("</solution>") != 1:
        return FormatCheck(False, None, "the answer must hold exactly one <solution>...</solution>")
    start = history.index("<solution>")
    end = history.index("</solution>")
    if end < start:
        return FormatCheck(False, None, "</solution> comes before <solution>")
    solution = history[start + len("<solution>"):end].strip()
    if _TAGS_BANNED_IN_SOLUTION.search(solution):
        return FormatCheck(False, None, "the solution may not contain <think>, <sql> or <observation> tags")
    if not solution:
        return FormatCheck(False, None, "the solution is empty")
    if require_think:
        if not _THINK_BLOCK.search(history):
            return FormatCheck(False, None, "no <think>...</think> block")
        for match in _OBSERVATION_END.finditer(history, 0, start):
            if not history[match.end():].lstrip().startswith("<think>"):
                return FormatCheck(False, None, "a turn after an observation does not start with <think>")
    return FormatCheck(True, solution)
