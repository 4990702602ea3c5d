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
from test_rewards import SOLVE_SH, THREE_KEYS_SH
from test_rewards import _toml as three_keys_toml
from test_steps import PIPELINE_FILES, PIPELINE_TOML

SKYRL = Path(sys.executable).parent / "skyrl"
BUILTIN_COUNT = sum(1 for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())
TEST_TASKS = Path(__file__).parent / "tasks"  # a sidecar API (compose-api), a public python: image (python-substitute), ...
# performance (0.5 at best) is logged but weighs nothing here, so the oracle's reward is 1
THREE_KEYS_TOML = three_keys_toml("reward_weights = {correctness = 0.5, style = 0.5}")
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
    assert "PASS  pickle" in result.stdout and "PASS  gold[row 1]" in result.stdout


def test_oracle_rollout_writes_one_result_per_task(docker_backend: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"  # two built-in tasks, one of them three steps long (every task: the dataset report)
    tasks.mkdir()
    for name in ("count-lines", "word-counter-project"):
        (tasks / name).symlink_to(BUILTIN_TASKS / name)
    out = tmp_path / "oracle.jsonl"
    result = skyrl("rollout", "--env", "harbor_terminal", "--oracle", "--n-tasks", "0", "--out", str(out),
                   f"env.tasks={tasks}", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "oracle solved all 2 task(s) at reward 1" in result.stdout
    lines = read_jsonl(out)
    for line in lines:
        assert line["reward"] == 1.0 and line["error"] is None and line["terminated"], line
        assert line["metrics"]["passed"] == 1.0 and line["report"]["backend"] == "docker"
    by_name = {line["task_name"]: line for line in lines}
    assert sorted(by_name) == ["skyrl/count-lines", "skyrl/word-counter-project"]
    assert by_name["skyrl/word-counter-project"]["turns"] == 3


@pytest.mark.slow
def test_the_dataset_report_runs_every_builtin_task_and_each_public_form(docker_backend: str, tmp_path: Path) -> None:
    """`skyrl check harbor_terminal --dataset`: the built-in tasks plus a task of each public form (a sidecar API,
    a public python: base image through the map, step workdirs with setups and healthchecks, a three-key reward)."""
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    for task in [*BUILTIN_TASKS.iterdir(), *TEST_TASKS.iterdir()]:
        if (task / "task.toml").is_file():
            (dataset / task.name).symlink_to(task)
    pipeline = write_task(dataset / "pipeline", PIPELINE_FILES, toml=PIPELINE_TOML)
    os.chmod(Path(pipeline["task_path"]) / "steps/prepare/workdir/bin/tool.sh", 0o755)
    write_task(dataset / "three-keys", {"tests/test.sh": THREE_KEYS_SH, "solution/solve.sh": SOLVE_SH},
               toml=THREE_KEYS_TOML)
    result = skyrl("check", "harbor_terminal", "--dataset", str(dataset), "--json", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 0, json.dumps(report, indent=1) + result.stderr
    rows = {row["task"]: row for row in report["rows"]}
    # + compose-api, python-substitute, separate-tests-image, pipeline, three-keys, and forged-greet: a check plays
    # forgeable tasks, marked, as skyrl eval does
    assert len(rows) == BUILTIN_COUNT + 6 and report["failed"] == 0
    assert "test/forged-greet [forgeable]" in rows
    for row in rows.values():
        assert (row["oracle reward"], row["end"], row["problem"], row["backend"]) == (1.0, "terminated", "", "docker")
        assert row["build"].startswith("ok (")
    assert rows["skyrl/count-lines"]["image source"] == "FROM skyrl-terminal-base:bookworm-1"
    assert rows["test/compose-api"]["image source"].endswith("+ services api-server")
    assert rows["test/python-substitute"]["image source"] == (
        "FROM python:3.11-slim-bookworm (python:3.11-slim-bookworm: a stand-in from Debian bookworm)")


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
