"""Fixtures shared by the bridges' tests: ``train_two_steps``, a real two-step ``skyrl run`` on tiny-random (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")
# Two GRPO steps of one prompt, two samples each, short replies; a test adds its env's own overrides.
TINY_TRAIN = ["--trainer", "fsdp_grpo", "--model", "tiny-random", "generator.n_samples_per_prompt=2",
              "generator.max_tokens_per_turn=16", "generator.max_total_tokens=48",
              "generator.max_context_length=4096", "trainer.steps=2", "trainer.batch_size=1", "run.console=false",
              "trainer.eval_samples=2"]


@dataclass
class TrainRun:
    """A finished run: its folder, its metrics records of steps 1 and 2, and its samples."""

    run_dir: Path
    steps: list[dict[str, Any]]
    samples: list[dict[str, Any]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def train_two_steps(tmp_path: Path) -> Callable[..., TrainRun]:
    """``train_two_steps(env, *overrides, pythonpath=None)``: runs ``skyrl run --env <env>`` for two steps on
    tiny-random and checks what every bridge's run must show (steps 1 and 2 logged with a loss, two episodes
    per step and no errors, samples of ``env`` with no error); a failure shows the tail of the run's output.
    ``pythonpath`` (a folder) is put on the run's PYTHONPATH, for envs defined next to a test."""

    def run(env: str, *overrides: str, pythonpath: Path | None = None) -> TrainRun:
        pytest.importorskip("skyrl_trainers")
        run_dir = tmp_path / "run"
        environ = dict(os.environ)
        if pythonpath is not None:
            environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
        command = [str(SKYRL), "run", "--env", env, *TINY_TRAIN, *overrides, f"run.output_dir={run_dir}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environ)
        tail = f"\n--- stdout (tail) ---\n{done.stdout[-3000:]}\n--- stderr (tail) ---\n{done.stderr[-3000:]}"
        if done.returncode != 0:
            pytest.fail(f"`skyrl run --env {env}` exited with {done.returncode}{tail}")
        steps = [r for r in _jsonl(run_dir / "metrics.jsonl") if r.get("step", 0) >= 1]
        samples = _jsonl(run_dir / "samples.jsonl")
        problems = []
        if [s["step"] for s in steps] != [1, 2]:
            problems.append(f"logged steps {[s['step'] for s in steps]}, not [1, 2]")
        problems += [f"step {s['step']}: {s}" for s in steps if s.get("rollout/episodes") != 2.0
                     or s.get("rollout/errors") != 0.0 or "train/loss" not in s]
        if not samples:
            problems.append("no samples")
        problems += [f"sample: {s}" for s in samples if s.get("env_id") != env or s.get("error") is not None]
        if problems:
            pytest.fail("\n".join(problems) + tail)
        return TrainRun(run_dir, steps, samples)

    return run
