"""End to end: `skyrl run --env openenv --trainer fsdp_grpo` on tiny-random, two GRPO steps on CPU, with an OpenEnv
env of this folder run in process (env.name=module:EnvironmentClass)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_skyrl_run_trains_on_an_inprocess_openenv_env_with_tiny_random(train_two_steps):
    run = train_two_steps("openenv", "env.name=bridge_openenv_toys:EchoEnvironment", "env.max_turns=2",
                          "env.train_tasks=4", "env.test_tasks=2", pythonpath=HERE)
    for step in run.steps:
        assert 0.0 <= step["reward/mean"] <= 1.0, step
        assert "env/invalid_actions" in step and "env/peer_done" in step
    assert all(sample["turns"] for sample in run.samples)
