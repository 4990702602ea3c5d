"""The ``skyrl`` command line on harbor_terminal, run as a user runs it (the installed ``skyrl`` script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harbor_helpers import write_task
from skyrl_harbor_terminal.env import BUILTIN_TASKS

SKYRL = Path(sys.executable).parent / "skyrl"
BUILTIN_COUNT = sum(1 for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())
TEST_SH = """\
#!/bin/bash
[ "$(cat /app/answer.txt 2>/dev/null)" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


def skyrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKYRL), *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_skyrl_check_passes(docker_backend: str, tmp_path: Path) -> None:
    result = skyrl("check", "harbor_terminal", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "FAIL " not in result.stdout
    assert "PASS  pickle" in result.stdout and "PASS  gold[0]" in result.stdout


@pytest.mark.slow
def test_oracle_rollout_of_every_builtin_task_scores_1(docker_backend: str, tmp_path: Path) -> None:
    out = tmp_path / "oracle.jsonl"
    result = skyrl("rollout", "--env", "harbor_terminal", "--oracle", "--n-tasks", "0", "--out", str(out),
                   cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"oracle solved all {BUILTIN_COUNT} task(s) at reward 1" in result.stdout
    lines = read_jsonl(out)
    assert len(lines) == BUILTIN_COUNT
    assert len({line["task_name"] for line in lines}) == BUILTIN_COUNT
    for line in lines:
        assert line["reward"] == 1.0 and line["error"] is None and line["terminated"], line
        assert line["metrics"]["passed"] == 1.0
    by_name = {line["task_name"]: line for line in lines}
    assert by_name["skyrl/word-counter-project"]["turns"] == 3


def test_oracle_rollout_names_the_task_whose_oracle_fails(docker_backend: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    write_task(tasks / "right-answer", {"tests/test.sh": TEST_SH, "solution/solve.sh": "echo 42 > /app/answer.txt\n"})
    write_task(tasks / "broken-oracle", {"tests/test.sh": TEST_SH, "solution/solve.sh": "echo 41 > /app/answer.txt\n"})
    out = tmp_path / "oracle.jsonl"
    result = skyrl("rollout", "--env", "harbor_terminal", "--oracle", "--n-tasks", "0", "--out", str(out),
                   f"env.tasks={tasks}", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "oracle failed on 1 task(s): test/broken-oracle" in output
    assert "right-answer" not in output.split("oracle failed on", 1)[1]
    rewards = {line["task_name"]: line["reward"] for line in read_jsonl(out)}
    assert rewards == {"test/right-answer": 1.0, "test/broken-oracle": 0.0}
