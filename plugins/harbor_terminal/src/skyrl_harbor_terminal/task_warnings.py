"""A dataset's task warnings, one per kind: a warning many tasks share is said once, with a count and a few names.

A Harbor dataset of 100 tasks written from one template warns about the same unknown key 100
times; ``skyrl check`` would print 100 ``WARN`` lines. Each task keeps its own list
(``HarborTask.warnings``); the dataset's summary groups them by kind: the message without the
task's folder and without line numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .task import HarborTask

EXAMPLES = 3
_LINE = re.compile(r"^([^\s:]+):\d+: ")  # "tests/test.sh:3: agent-code: ..." -> "tests/test.sh: agent-code: ..."


def warning_kind(task: HarborTask, message: str) -> str:
    """``message`` without the task's folder and line number, so that every task's copy of it reads the same."""
    prefix = f"{task.path}/"
    text = message[len(prefix):] if message.startswith(prefix) else message
    return _LINE.sub(r"\1: ", text, count=1)


def dataset_warnings(tasks: Sequence[HarborTask], examples: int = EXAMPLES) -> list[str]:
    """One message per kind: a task's own messages when only it has that kind, else the kind, a count and names."""
    groups: dict[str, dict[str, tuple[str, list[str]]]] = {}  # kind -> task folder -> (its name, its messages)
    for task in tasks:
        for message in dict.fromkeys(task.warnings):
            entry = groups.setdefault(warning_kind(task, message), {}).setdefault(str(task.path), (task.name, []))
            entry[1].append(message)
    summary: list[str] = []
    for kind, by_task in groups.items():
        if len(by_task) == 1:
            summary.extend(next(iter(by_task.values()))[1])
            continue
        names = [name for name, _ in by_task.values()]
        more = f", and {len(names) - examples} more" if len(names) > examples else ""
        summary.append(f"{kind} (in {len(names)} tasks: {', '.join(names[:examples])}{more})")
    return summary
