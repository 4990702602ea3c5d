"""Steps with no learning signal (every group's samples scored alike) are counted and warned about once."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from skyrl_trainers.signal import NoSignalMonitor, zero_variance_share
from trainer_support import read_metrics

HERE = Path(__file__).parent
SKYRL = Path(sys.executable).with_name("skyrl")
WARNING = "no learning signal in"


def test_the_share_counts_groups_whose_samples_all_scored_the_same():
    groups = {"a": [0.0, 0.0], "b": [1.0, 0.0], "c": [0.5], "d": [1.0, 1.0]}
    assert zero_variance_share(groups) == (0.75, 4)  # a group of one has nothing to be compared with
    assert zero_variance_share(groups, estimator="rloo") == (0.75, 4)
    assert zero_variance_share(groups, estimator="reinforce_pp") == (0.0, 1)  # one batch-wide baseline
    assert zero_variance_share({"a": [1.0, 1.0]}, estimator="reinforce_pp") == (1.0, 1)
    assert zero_variance_share({}) == (0.0, 0)


def test_the_warning_comes_once_per_streak_and_names_cause_and_fixes(caplog):
    monitor = NoSignalMonitor(share=0.9, patience=3, reward_range=(0.0, 1.0),
                              hints={"n_samples_per_prompt": 4, "temperature": 0.7})
    flat, mixed = {"a": [0.0, 0.0], "b": [0.0, 0.0]}, {"a": [0.0, 1.0], "b": [0.0, 0.0]}
    caplog.set_level(logging.WARNING, logger="skyrl_trainers.signal")
    streaks = []
    for step, groups in enumerate([flat, flat, flat, flat, mixed, flat, flat, flat], start=1):
        share, _ = zero_variance_share(groups)
        streaks.append(monitor.update(step, share, groups)["train/no_signal_steps"])
    assert streaks == [1, 2, 3, 4, 0, 1, 2, 3]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and warnings[0].startswith("no learning signal in steps 1-3: 100% of the task groups")
    assert warnings[1].startswith("no learning signal in steps 6-8")
    assert "no sample solved its task" in warnings[0] and "an easier split" in warnings[0]
    for fix in ("generator.n_samples_per_prompt, now 4; try 8", "generator.temperature, now 0.7", "reward shaping"):
        assert fix in warnings[0]


def _skyrl_run(env: str, out: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "SKYRL_PLUGIN_MODULES": "signal_envs", "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    command = [str(SKYRL), "run", "--env", env, "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "trainer.steps=3", "trainer.batch_size=2", "trainer.lr=1e-3", "trainer.micro_batch_tokens=512",
               "trainer.export=false", "trainer.eval_samples=0", "generator.n_samples_per_prompt=2",
               "generator.max_tokens_per_turn=6",
               "generator.max_total_tokens=12", "run.console=false", f"run.output_dir={out}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment, cwd=HERE)


@pytest.mark.parametrize("env", ["constant_reward", "varied_reward"])
def test_a_run_on_a_constant_reward_warns_once_and_a_normal_run_does_not(env, tmp_path):
    result = _skyrl_run(env, tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3]
    if env == "constant_reward":
        assert result.stderr.count(WARNING) == 1, result.stderr
        assert "no learning signal in steps 1-3" in result.stderr
        assert "the reward does not depend on the reply" in result.stderr
        assert [r["train/zero_variance_groups"] for r in records] == [1.0, 1.0, 1.0]
        assert [r["train/no_signal_steps"] for r in records] == [1.0, 2.0, 3.0]
        assert all(r["train/grad_norm"] == 0.0 for r in records)
    else:
        assert WARNING not in result.stderr + result.stdout, result.stderr
        assert all(r["train/zero_variance_groups"] < 0.9 for r in records), records
        assert all(r["train/no_signal_steps"] == 0.0 for r in records)
