"""One set of defaults: `skyrl rollout --env rlm_repl` plays what `skyrl run --env rlm_repl` trains and evaluates
on (the env's run_defaults and the starter curriculum's held-out split), not the long evidence split that
overflows tiny-random's 2,048-token context."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")


def test_skyrl_rollout_on_rlm_repl_defaults_to_the_split_training_evaluates_on(tmp_path):
    pytest.importorskip("skyrl_trainers")  # provides the hf engine and tiny-random
    out = tmp_path / "rollouts.jsonl"
    command = [str(SKYRL), "rollout", "--env", "rlm_repl", "--model", "tiny-random", "--n-tasks", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "split: starter_test (rlm_repl's held-out split for training split 'starter'" in done.stderr
    [episode] = [r for r in map(json.loads, out.read_text().splitlines()) if r["parent_id"] is None]
    assert episode["task"]["split"] == "starter_test" and episode["error"] is None
    assert len(episode["turns"]) <= 2  # the run's env.max_turns, not the env's own 10
    assert all(turn["generated_tokens"] <= 64 for turn in episode["turns"])  # the run's max_tokens_per_turn
    assert episode["messages"][1]["role"] == "user" and "FINAL(" in episode["messages"][2]["content"]  # worked example
