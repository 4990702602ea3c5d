"""End to end: `skyrl run --env search --trainer fsdp_grpo` on tiny-random (two GRPO steps on CPU).

The env uses its defaults: in-process BM25 over the built-in corpus, its index built on first use
into the session's cache folder. The run must finish, log the env's metrics each step and export.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")
ENV_METRICS = ("env/searches", "env/answered", "env/em", "env/subem", "env/f1", "env/retrieval_errors",
               "env/retrieval_latency_s")


@pytest.mark.slow
def test_skyrl_run_trains_on_the_search_env_with_tiny_random(tmp_path, search_cache):
    pytest.importorskip("skyrl_trainers")
    run_dir = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "search", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "env.max_turns=2", "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=16",
               "generator.max_total_tokens=48", "generator.max_context_length=4096", "trainer.steps=2",
               "trainer.batch_size=1", f"run.output_dir={run_dir}", "run.console=false",
               "trainer.eval_samples=2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "SKYRL_SEARCH_CACHE": str(search_cache)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[0]["eval/episodes"] == 2.0  # held-out evaluation before training
    steps = records[1:]
    assert [s["step"] for s in steps] == [1, 2] and "eval/reward_mean" in steps[-1]  # and after the last step
    for step in steps:
        assert step["rollout/episodes"] == 2.0 and step["rollout/errors"] == 0.0, step
        assert 0.0 <= step["reward/mean"] <= 1.0 and "train/loss" in step
        missing = [key for key in ENV_METRICS if key not in step]
        assert not missing, f"env metrics missing from step {step['step']}: {missing}"
        assert step["env/retrieval_errors"] == 0.0

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["env_id"] == "search" for s in samples)
    for sample in samples:
        assert sample["error"] is None and sample["turns"], sample["error"]
        assert {"searches", "answered", "em", "retrieval_errors"} <= set(sample["metrics"])
    assert (run_dir / "export" / "config.json").exists()
