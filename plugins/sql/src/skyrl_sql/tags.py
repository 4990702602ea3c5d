"""SkyRL-SQL's action format: ``<think>``, ``<sql>`` to run a query, ``<solution>`` to submit.

The episode's format is judged with SkyRL-SQL's rules, but on the model's own actions only: where
SkyRL-SQL reads the joined history, the env's observations are replaced by a fixed stand-in, so
text inside a query result (a cell holding ``<solution>`` or ``</observation>``) can neither
break a correct episode nor submit a query the model never wrote.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

SQL_TAG = re.compile(r"<sql>(.*?)</sql>", re.DOTALL)
_TAGS_BANNED_IN_SOLUTION = re.compile(r"</?(think|sql|observation)\b", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_OBSERVATION_END = re.compile(r"</observation>")
# Stands for the env's reply between two actions; its content is fixed, never the real observation.
OBSERVATION_STAND_IN = "\n<observation></observation>\n"


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


def check_format(actions: Sequence[str], *, require_think: bool = True) -> FormatCheck:
    """Validate an episode's actions and extract its submitted SQL.

    The actions are joined with :data:`OBSERVATION_STAND_IN` between them (every turn but the
    last got an observation), and that text is valid when: it has exactly one ``<solution>``
    followed by exactly one ``</solution>``; the solution holds no ``<think>``/``<sql>``/
    ``<observation>`` tag; and, with ``require_think``, there is a ``<think>...</think>`` block
    and every ``</observation>`` before the solution is followed by ``<think>``.
    """
    text = OBSERVATION_STAND_IN.join(actions)
    if text.count("<solution>") != 1 or text.count("</solution>") != 1:
        return FormatCheck(False, None, "the answer must hold exactly one <solution>...</solution>")
    start = text.index("<solution>")
    end = text.index("</solution>")
    if end < start:
        return FormatCheck(False, None, "</solution> comes before <solution>")
    solution = text[start + len("<solution>"):end].strip()
    if _TAGS_BANNED_IN_SOLUTION.search(solution):
        return FormatCheck(False, None, "the solution may not contain <think>, <sql> or <observation> tags")
    if not solution:
        return FormatCheck(False, None, "the solution is empty")
    if require_think:
        if not _THINK_BLOCK.search(text):
            return FormatCheck(False, None, "no <think>...</think> block")
        for match in _OBSERVATION_END.finditer(text, 0, start):
            if not text[match.end():].lstrip().startswith("<think>"):
                return FormatCheck(False, None, "a turn after an observation does not start with <think>")
    return FormatCheck(True, solution)
