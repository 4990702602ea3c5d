"""trainer.backend=ray: two trainer ranks as Ray actors in a placement group on a local Ray instance."""

from pathlib import Path

import pytest
from skyrl_core import ray_cluster
from skyrl_trainers.trainer import FSDPGRPOTrainer
from trainer_support import read_metrics


@pytest.mark.slow
def test_two_rank_cpu_job_on_local_ray(run_config):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        cfg = run_config(trainer={"world_size": 2, "backend": "ray", "steps": 2, "export": False})
        summary = FSDPGRPOTrainer(cfg).fit()
        groups = list(ray.util.placement_group_table().values())
    finally:
        ray_cluster.disconnect(True)
    assert summary["steps"] == 2
    run_dir = Path(cfg.run.output_dir)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert sorted(p.name for p in checkpoint.glob("worker_rank*.pt")) == ["worker_rank0.pt", "worker_rank1.pt"]
    [group] = groups
    assert group["strategy"] == "PACK" and list(group["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}]
