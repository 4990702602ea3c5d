"""End to end: `skyrl run --env verifiers --trainer fsdp_grpo` on tiny-random with the single-turn test taskset."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_skyrl_run_trains_on_a_verifiers_taskset_with_tiny_random(train_two_steps):
    run = train_two_steps("verifiers", "env.name=vf_bridge_quiz:load_environment", pythonpath=HERE)
    for step in run.steps:
        assert -0.5 <= step["reward/mean"] <= 1.25, step
        assert "env/reward_format" in step  # the task's own reward functions, logged per episode
