"""End to end: `skyrl run --env harbor_terminal --trainer fsdp_grpo` on tiny-random (two GRPO steps on CPU).

Two built-in tasks (linked into a folder of their own, so `env.tasks` is exercised and the task
images stay those of the built-in folders) on the docker backend. The run must finish, log the
env's metrics, write samples and leave no container of its own behind. A forgeable task in the same
folder is left out of training with one line naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKYRL = Path(sys.executable).with_name("skyrl")
TASKS = ("hello-world-file", "count-lines")
ENV_METRICS = ("env/passed", "env/commands", "env/command_timeouts", "env/no_command_turns", "env/steps_verified",
               "env/container_errors", "env/agent_command_s", "env/verify_s")


FORGED = Path(__file__).parent / "tasks" / "forged-greet"  # its tests run /app/greet.sh as root


def _task_subset(folder: Path, *more: Path) -> Path:
    from skyrl_harbor_terminal.env import BUILTIN_TASKS

    folder.mkdir()
    for task in [*(BUILTIN_TASKS / name for name in TASKS), *more]:
        (folder / task.name).symlink_to(task, target_is_directory=True)
    return folder


def _containers_of(pid: int) -> list[str]:
    from skyrl_sandbox.backends.docker.client import DOCKER
    from skyrl_sandbox.backends.docker.worker import OWNER_LABEL

    found = DOCKER.shared_client().api.containers(all=True, filters={"label": [f"{OWNER_LABEL}={pid}"]})
    return [container["Id"][:12] for container in found]


@pytest.mark.slow
def test_skyrl_run_trains_on_harbor_terminal_with_tiny_random(tmp_path, docker_backend):
    pytest.importorskip("skyrl_trainers")
    tasks = _task_subset(tmp_path / "tasks", FORGED)  # a forgeable task: left out of training by default
    run_dir = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "harbor_terminal", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               f"env.tasks={tasks}", f"env.backend={docker_backend}", "env.max_turns=2",
               "env.command_timeout_s=10", f"env.build_logs={tmp_path / 'build-logs'}",
               "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=16", "generator.max_total_tokens=48",
               "generator.max_context_length=4096", "trainer.steps=2", "trainer.batch_size=1",
               f"run.output_dir={run_dir}", "run.console=false",
               "trainer.eval_samples=0"]  # each evaluation task is one machine more; tests/trainers cover it
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "SKYRL_HARBOR_CACHE": str(tmp_path / "cache")})
    try:
        stdout, stderr = process.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail("skyrl run did not finish within 900 s:\n" + stdout[-3000:] + stderr[-3000:])
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "1 of 3 task(s) left out of split 'train'" in stdout + stderr and "test/forged-greet" in stdout + stderr

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["rollout/episodes"] == 2.0 and step["rollout/errors"] == 0.0, step
        assert 0.0 <= step["reward/mean"] <= 1.0 and "train/loss" in step
        missing = [key for key in ENV_METRICS if key not in step]
        assert not missing, f"env metrics missing from step {step['step']}: {missing}"
        assert step["env/container_errors"] == 0.0

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["env_id"] == "harbor_terminal" for s in samples)
    seen = {sample["task"]["name"].split("/")[-1] for sample in samples if isinstance(sample.get("task"), dict)}
    assert seen <= set(TASKS)
    for sample in samples:
        assert {"passed", "commands", "steps_verified"} <= set(sample["metrics"])
        assert sample["error"] is None and sample["turns"], sample["error"]
        assert "error" not in sample["turns"][-1]["info"], sample["turns"][-1]["info"]
    assert (run_dir / "export" / "config.json").exists()

    # Every machine of the run (labelled with the run's pid as owner) was removed when its episode ended.
    assert _containers_of(process.pid) == []


@pytest.mark.slow
def test_oracle_rollout_of_the_same_tasks_starts_machines_and_removes_them(tmp_path, docker_backend):
    """The tiny random policy never writes a ```bash block, so the run above starts no machine; the oracle does."""
    tasks = _task_subset(tmp_path / "tasks")
    out = tmp_path / "oracle.jsonl"
    command = [str(SKYRL), "rollout", "--env", "harbor_terminal", "--oracle", "--n-tasks", "0", "--out", str(out),
               f"env.tasks={tasks}", f"env.backend={docker_backend}", f"env.build_logs={tmp_path / 'build-logs'}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["task_name"].split("/")[-1] for r in results) == sorted(TASKS)
    for result in results:
        assert result["reward"] == 1.0 and result["error"] is None, result
        metrics = result["metrics"]
        assert metrics["passed"] == 1.0 and metrics["commands"] >= 1 and metrics["steps_verified"] == 1.0
        assert metrics["container_errors"] == 0.0
    assert _containers_of(process.pid) == []
