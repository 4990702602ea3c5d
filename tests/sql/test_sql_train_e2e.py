"""End to end: `skyrl run --env sql --trainer fsdp_grpo` on tiny-random (two GRPO steps on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")


@pytest.mark.slow
def test_skyrl_run_trains_on_the_sql_env_with_tiny_random(tmp_path, sql_cache):
    pytest.importorskip("skyrl_trainers")
    run_dir = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "sql", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=16", "generator.max_total_tokens=48",
               "generator.max_context_length=4096", "env.max_turns=2", "trainer.steps=2", "trainer.batch_size=1",
               f"run.output_dir={run_dir}", "run.console=false",
               "trainer.eval_samples=2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SKYRL_SQL_CACHE": str(sql_cache)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[0]["eval/episodes"] == 2.0  # held-out evaluation before training
    steps = records[1:]
    assert [s["step"] for s in steps] == [1, 2] and "eval/reward_mean" in steps[-1]  # and after the last step
    for step in steps:
        assert step["rollout/errors"] == 0.0 and -1.0 <= step["reward/mean"] <= 1.0
        assert "train/loss" in step
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["env_id"] == "sql" for s in samples)
    # Random text is malformed: the last turn of each episode carries SkyRL-SQL's format verdict.
    for sample in samples:
        assert "execution_match" in sample["metrics"]
        assert "reward_components" in sample["turns"][-1]["info"]
    assert (run_dir / "export" / "config.json").exists()
