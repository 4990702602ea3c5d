"""fsdp_grpo with its envs in env workers on a real local Ray (generator.env_placement=ray), in sync and async
modes: the run trains, every sampled episode records the node that ran its env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skyrl_core import ray_cluster
from trainer_support import read_metrics

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray_cluster.disconnect(True)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_fsdp_grpo_trains_with_envs_on_ray_workers(run_config, local_ray, mode):
    from skyrl_trainers.trainer import FSDPGRPOTrainer

    extra = {"off_policy": {"tis": "token"}, "checkpoint_every": 0} if mode == "async" else {}
    cfg = run_config(trainer={"steps": 2, "mode": mode, "export": False, "samples_per_step": 8, **extra},
                     generator={"env_placement": "ray", "envs_per_worker": 2}, run={"seed": 3})
    summary = FSDPGRPOTrainer(cfg).fit()
    assert summary["steps"] == 2
    records = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["ray/env_workers"] >= 1.0 and r["ray/workers_lost"] == 0.0 for r in records)
    samples = [json.loads(line) for line in (Path(cfg.run.output_dir) / "samples.jsonl").read_text().splitlines()]
    node = local_ray.get_runtime_context().get_node_id()
    assert samples and {s["env_node"] for s in samples} == {node}
