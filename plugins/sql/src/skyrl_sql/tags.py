"""SkyRL-SQL's action format: ``<think>``, ``<sql>`` to run a query, ``<solution>`` to submit.

The episode's format is judged with SkyRL-SQL's rules, but on the model's own actions only, one
action at a time: the env knows where each action ends and its observation begins, so nothing is
found by searching a joined text for ``</observation>``. The text of a ``<sql>...</sql>`` block is
the query (it may quote tags the data holds) and never counts as format; neither does a tag inside
a string literal or quoted name of the submitted query. What a query returns is never read at all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from skyrl_core.tags import outside_blocks

from skyrl_sql.reward import strip_literals

SQL_TAG = re.compile(r"<sql>(.*?)</sql>", re.DOTALL)
_TAGS_BANNED_IN_SOLUTION = re.compile(r"</?(think|sql|observation)\b", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_SOLUTION_TAG = re.compile(r"</?solution>")
_EXACTLY_ONE = "the answer must hold exactly one <solution>...</solution>"


def outside_queries(action: str) -> str:
    """``action`` with every complete ``<sql>...</sql>`` block blanked to spaces (positions kept):
    the part of the action whose tags are format. A block opened inside a solution is the solution's."""
    return outside_blocks(action, "sql", "solution")


def has_solution(action: str) -> bool:
    """SkyRL-SQL ends the episode as soon as an action holds both solution tags (outside its queries)."""
    text = outside_queries(action)
    return "<solution>" in text and "</solution>" in text


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
    """Validate an episode's actions (every one but the first came after an observation) and
    extract its submitted SQL.

    Read outside their queries, the actions are valid when: the last one holds exactly one
    ``<solution>`` followed by exactly one ``</solution>`` and no earlier one holds a solution tag;
    the solution is not empty and holds no ``<think>``/``<sql>``/``<observation>`` tag outside its
    string literals and quoted names; and, with ``require_think``, some action has a
    ``<think>...</think>`` block outside its solution and every action after the first starts with
    ``<think>``.
    """
    if not actions:
        return FormatCheck(False, None, _EXACTLY_ONE)
    read = [outside_queries(action) for action in actions]
    if any(_SOLUTION_TAG.search(text) for text in read[:-1]):
        return FormatCheck(False, None, _EXACTLY_ONE)
    last = read[-1]
    if last.count("<solution>") != 1 or last.count("</solution>") != 1:
        return FormatCheck(False, None, _EXACTLY_ONE)
    start, end = last.index("<solution>") + len("<solution>"), last.index("</solution>")
    if end < start:
        return FormatCheck(False, None, "</solution> comes before <solution>")
    solution = actions[-1][start:end].strip()
    if _TAGS_BANNED_IN_SOLUTION.search(strip_literals(solution)):
        return FormatCheck(False, None, "the solution may not contain <think>, <sql> or <observation> tags")
    if not solution:
        return FormatCheck(False, None, "the solution is empty")
    if require_think:
        read[-1] = last[:start] + last[end:]
        if not any(_THINK_BLOCK.search(text) for text in read):
            return FormatCheck(False, None, "no <think>...</think> block")
        if not all(action.lstrip().startswith("<think>") for action in actions[1:]):
            return FormatCheck(False, None, "a turn after an observation does not start with <think>")
    return FormatCheck(True, solution)
