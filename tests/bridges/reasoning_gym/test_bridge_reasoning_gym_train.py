"""End to end: `skyrl run --env reasoning_gym --trainer fsdp_grpo` on tiny-random, two GRPO steps on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")


@pytest.mark.slow
def test_skyrl_run_trains_on_a_reasoning_gym_dataset_with_tiny_random(tmp_path):
    pytest.importorskip("skyrl_trainers")
    pytest.importorskip("reasoning_gym")
    run_dir = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "reasoning_gym", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "env.name=gcd", "env.args.size=4", "env.test_size=2", "generator.n_samples_per_prompt=2",
               "generator.max_tokens_per_turn=16", "generator.max_total_tokens=32",
               "generator.max_context_length=4096", "trainer.steps=2", "trainer.batch_size=1",
               f"run.output_dir={run_dir}", "run.console=false", "trainer.eval_samples=2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if record["step"] >= 1]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["rollout/errors"] == 0.0 and 0.0 <= step["reward/mean"] <= 1.0 and "train/loss" in step
        assert {"env/score", "env/answered", "env/correct"} <= set(step)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["env_id"] == "reasoning_gym" and s["error"] is None for s in samples)
    assert (run_dir / "export" / "config.json").exists()
