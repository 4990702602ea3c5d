"""Tasks whose reward the policy can forge, and what a dataset does with them (``env.forgeable_tasks``).

A task is forgeable when the task lint (:mod:`.lint`) reports, and nothing resolves, a line of its
tests that runs what the agent can write with the tests' privileges (``agent-code``,
``agent-path``) or collects the agent's own test files (``agent-tests``): a policy that writes the
reward file from there earns the reward without doing the task, and training would teach it to.
``[metadata.skyrl] tests_run_agent_code = true`` and ``skyrl-lint: ignore`` comments resolve
findings. The option:

- ``skip`` (what ``skyrl run`` uses): the dataset leaves them out.
- ``include`` (what ``skyrl eval`` and ``skyrl rollout`` use, through the env's ``rollout_defaults``):
  the dataset has them, marked: the row's name ends with ``[forgeable]``, its ``forgeable`` field and
  the episode's ``info["forgeable"]`` name the first finding.

Either way one line per dataset names them, why, and the option. A row of a forgeable task that
reached the env another way (a task file) is played only under ``include`` or when it carries the mark.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .lint import LintFinding, lint_task
from .task_errors import HarborTaskWarning
from .task_model import HarborTask

ForgeablePolicy = Literal["skip", "include"]
FORGEABLE_RULES = frozenset({"agent-code", "agent-path", "agent-tests"})
MARK = " [forgeable]"
EXAMPLES = 5
_FIX = ("fix their tests as the lint says (skyrl check harbor_terminal env.tasks=... lists every line), declare "
        "[metadata.skyrl] tests_run_agent_code = true where running the agent's code as the agent user is the point, "
        "or set env.forgeable_tasks=include")


class ForgeableDatasetError(ValueError):
    """Every task of a split was left out as forgeable."""


def forgeable_findings(task: HarborTask) -> list[LintFinding]:
    """The task's unresolved findings that let a policy forge its reward (empty: the task is not forgeable)."""
    return [finding for finding in lint_task(task) if finding.rule in FORGEABLE_RULES]


def select_rows(rows: Sequence[dict[str, Any]], task_of: Callable[[str], HarborTask], policy: ForgeablePolicy,
                split: str) -> list[dict[str, Any]]:
    """``rows`` without the forgeable tasks, or with them marked (see the module); one warning names them."""
    found = {index: findings for index, row in enumerate(rows)
             if (findings := forgeable_findings(task_of(row["task_path"])))}
    if not found:
        return list(rows)
    named = [f"{rows[index]['name']} ({findings[0].path}:{findings[0].line}: {findings[0].rule})"
             for index, findings in found.items()]
    more = f", and {len(named) - EXAMPLES} more" if len(named) > EXAMPLES else ""
    listed = ", ".join(named[:EXAMPLES]) + more
    why = "their tests run files the agent can write with the tests' privileges, so a policy could write its own reward"
    if policy == "skip":
        if len(found) == len(rows):
            raise ForgeableDatasetError(
                f"every task of split {split!r} ({len(rows)}) is left out as forgeable (env.forgeable_tasks="
                f"{policy}): {why}: {listed}; {_FIX}")
        warnings.warn(f"env.forgeable_tasks={policy}: {len(found)} of {len(rows)} task(s) left out of split "
                      f"{split!r}: {why}: {listed}; to use them, {_FIX}", HarborTaskWarning, stacklevel=3)
        return [row for index, row in enumerate(rows) if index not in found]
    warnings.warn(f"env.forgeable_tasks={policy}: {len(found)} of {len(rows)} task(s) of split {split!r} are "
                  f"played though {why}; they are marked{MARK}: {listed}", HarborTaskWarning, stacklevel=3)
    return [{**row, "name": f"{row['name']}{MARK}", "forgeable": str(found[index][0])} if index in found else row
            for index, row in enumerate(rows)]


def refusal(task: HarborTask, row: dict[str, Any], policy: ForgeablePolicy) -> str | None:
    """Why an episode of ``row`` must not be played: a forgeable task that came without the mark (a task file)."""
    if policy == "include" or row.get("forgeable"):
        return None
    findings = forgeable_findings(task)
    if not findings:
        return None
    return (f"task {task.name} is forgeable ({findings[0]}), and env.forgeable_tasks={policy} leaves it out; set "
            "env.forgeable_tasks=include to play it (skyrl eval does)")
