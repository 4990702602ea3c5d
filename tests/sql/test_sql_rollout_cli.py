"""`skyrl rollout --env sql` is the evaluation command: it prints execution accuracy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from skyrl_sql.data.builtin import builtin_rows

SKYRL = Path(sys.executable).with_name("skyrl")


@pytest.mark.slow
def test_skyrl_rollout_prints_execution_accuracy(tmp_path, sql_cache):
    pytest.importorskip("skyrl_trainers")  # provides the hf engine and tiny-random
    out = tmp_path / "rollouts.jsonl"
    command = [str(SKYRL), "rollout", "--env", "sql", "--engine", "hf", "--model", "tiny-random", "--n-tasks", "2",
               "--split", "test", "--out", str(out), "generator.max_tokens_per_turn=8",
               "generator.max_context_length=4096", "env.max_turns=2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SKYRL_SQL_CACHE": str(sql_cache), "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = {line.split()[0]: line.split()[-1] for line in done.stdout.splitlines() if line.startswith("env/")}
    assert {"env/execution_match", "env/exact_match", "env/execution_errors", "env/turns"} <= set(summary)
    assert summary["env/execution_match"] == "0"  # random weights never write a valid solution
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["task"]["id"] for e in episodes] == [r["id"] for r in builtin_rows("test")[:2]]
