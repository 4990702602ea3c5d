"""Loader warnings once per dataset: the same warning of many tasks is one line naming a count and a few tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from skyrl_core.testing.check import SKIPPABLE
from skyrl_harbor_terminal.dataset import load_tasks
from skyrl_harbor_terminal.task import HarborTaskWarning
from skyrl_harbor_terminal.task_warnings import dataset_warnings
from task_fixtures import MINIMAL_TOML, write_task

GAMEABLE = "#!/bin/bash\n{pad}bash /app/run.sh\necho 1 > /logs/verifier/reward.txt\n"


def dataset(root: Path, n: int = 40) -> Path:
    """``n`` tasks from one template (an unknown key in each), two with another, two with a lint finding."""
    for index in range(n):
        toml = MINIMAL_TOML.replace('version = "1.0"', f'version = "1.0"\n[task]\nname = "test/t{index:02d}"')
        toml += "[environment]\nunknown_x = 1\n" + ("foo_bar = 2\n" if index < 2 else "")
        toml += '[[environment.mcp_servers]]\nname = "tools"\n' if index == 5 else ""
        extra = {"tests/test.sh": GAMEABLE.format(pad="true\n" * index)} if index in (7, 9) else None
        write_task(root, f"t{index:02d}", toml=toml, extra=extra)
    return root


def test_a_warning_shared_by_many_tasks_is_said_once(tmp_path: Path) -> None:
    root = dataset(tmp_path / "tasks")
    with pytest.warns(HarborTaskWarning) as record:
        tasks = load_tasks(root)
    messages = [str(w.message) for w in record]
    assert len(messages) == 4
    assert messages[0] == ("task.toml: [environment]: unknown key 'unknown_x' is ignored (in 40 tasks: test/t00, "
                           "test/t01, test/t02, and 37 more)")
    assert messages[1].startswith("task.toml: [environment]: unknown key 'foo_bar' is ignored") and \
        messages[1].endswith("(in 2 tasks: test/t00, test/t01)")
    assert messages[2] == f"{root}/t05/task.toml: [environment]: mcp_servers (1) is read but not honoured: the " \
                          "agent has only a shell, no MCP client"  # one task: its own message, as it is
    assert messages[3].startswith("tests/test.sh: agent-code: bash runs /app/run.sh") and \
        messages[3].endswith("(in 2 tasks: test/t07, test/t09)")  # lines 9 and 11: one kind
    # each task keeps its own list, with its folder and line numbers
    assert len(tasks[0].warnings) == 2 and all(str(tasks[0].path) in w for w in tasks[0].warnings)
    assert [w for w in tasks[9].warnings if "agent-code" in w][0].startswith(f"{tasks[9].path}/tests/test.sh:11: ")
    assert dataset_warnings(tasks) == messages


def test_skyrl_check_prints_one_line_per_kind(skyrl_cli, tmp_path: Path) -> None:
    root = dataset(tmp_path / "tasks", n=100)
    skips = [arg for family in SKIPPABLE for arg in ("--skip", family)]  # loading needs no machine
    result = skyrl_cli("check", "harbor_terminal", *skips, f"env.tasks={root}")
    assert result.exit_code == 0, result.output
    warns = [line for line in result.output.splitlines() if line.startswith("WARN  ")]
    assert len(warns) == 5, warns
    assert "(in 100 tasks: test/t00, test/t01, test/t02, and 97 more)" in warns[0]
    assert "2 of 100 task(s) left out of split 'train'" in warns[4]  # the two forgeable ones (test_forgeable)
    assert result.output.rstrip().endswith("5 warning(s)")


def test_the_keys_now_read_are_not_unknown(tmp_path: Path) -> None:
    toml = ('version = "1.0"\nartifacts = ["/app/out"]\n[environment]\nenv = { A = "1" }\nartifacts = ["/app/x"]\n'
            'healthcheck = { command = "true" }\n[[environment.mcp_servers]]\nname = "m"\n'
            '[[steps]]\nname = "one"\nhealthcheck = { command = "true" }\nartifacts = ["/app/y"]\n')
    write_task(tmp_path, "t", toml=toml, extra={"steps/one/instruction.md": "One.\n"})
    with pytest.warns(HarborTaskWarning) as record:
        (task,) = load_tasks(tmp_path / "t")
    assert [str(w.message) for w in record] == list(task.warnings)
    assert len(task.warnings) == 1 and "mcp_servers (1) is read but not honoured" in task.warnings[0]
