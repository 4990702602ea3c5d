"""`skyrl run --resume DIR` starts from the run's saved config; a run that fails before its first step
leaves no run folder behind (subprocess, tiny-random)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

SKYRL = Path(sys.executable).with_name("skyrl")
TINY = ["--env", "reverse_text", "--trainer", "fsdp_grpo", "--model", "tiny-random", "trainer.batch_size=1",
        "trainer.eval_samples=0", "trainer.export=false", "generator.n_samples_per_prompt=2",
        "generator.max_tokens_per_turn=6", "generator.max_total_tokens=12", "run.console=false"]


def skyrl(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKYRL), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"})


def test_resume_takes_the_saved_config_and_refuses_another_model(tmp_path):
    run_dir = tmp_path / "run"
    first = skyrl("run", *TINY, "trainer.steps=1", f"run.output_dir={run_dir}")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    saved = (run_dir / "config.yaml").read_text()

    other = skyrl("run", "--resume", str(run_dir), "--model", "smollm2-135m", "trainer.steps=2", timeout=60)
    assert other.returncode == 2
    assert (f"--resume {run_dir} was trained with trainer.model=tiny-random; this command asks for "
            "trainer.model=smollm2-135m") in other.stderr
    assert "Traceback" not in other.stderr + other.stdout and "run folder:" not in other.stdout  # nothing built
    assert (run_dir / "config.yaml").read_text() == saved

    resumed = skyrl("run", "--resume", str(run_dir), "trainer.steps=2")  # no --env, --trainer nor trainer.model
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["model"] == "tiny-random" and config["trainer"]["steps"] == 2
    assert config["generator"]["max_tokens_per_turn"] == 6  # the first command's overrides still hold


def test_resume_of_a_folder_that_is_not_a_run_says_so(tmp_path):
    result = skyrl("run", "--resume", str(tmp_path / "nowhere"), timeout=60)
    assert result.returncode == 2
    assert f"--resume {tmp_path / 'nowhere'}: the folder does not exist" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None and torch.cuda.is_available(),
                    reason="vLLM can start here")
def test_a_vllm_run_that_cannot_start_leaves_no_folder_and_advises_a_working_override(tmp_path):
    run_dir = tmp_path / "run"
    failed = skyrl("run", *TINY, "engine.id=vllm", f"run.output_dir={run_dir}", timeout=120)
    assert failed.returncode == 2 and "the vllm engine cannot start" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert not run_dir.exists()
    assert f"removed the run folder {run_dir}" in failed.stderr
    advice = re.search(r"the override (\S+)", failed.stderr)
    assert advice and advice.group(1) == "engine.id=hf"
    fixed = skyrl("run", *TINY, advice.group(1), f"run.output_dir={run_dir}", "--print-config", timeout=60)
    assert fixed.returncode == 0, fixed.stderr
    assert yaml.safe_load(fixed.stdout)["engine"]["id"] == "hf" and not run_dir.exists()
