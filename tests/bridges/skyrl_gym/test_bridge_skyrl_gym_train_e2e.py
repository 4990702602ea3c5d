"""End to end: `skyrl run --env skyrl_gym --trainer fsdp_grpo` on tiny-random over the built-in gsm8k rows (CPU)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gsm8k", "gsm8k_multi_turn"])
def test_skyrl_run_trains_two_steps_on_skyrl_gym_rows_with_tiny_random(train_two_steps, name):
    run = train_two_steps("skyrl_gym", f"env.name={name}",
                          "env.max_turns=2" if name == "gsm8k_multi_turn" else "env.max_turns=1")
    high = 1.0 if name == "gsm8k" else 1.1
    for step in run.steps:
        assert 0.0 <= step["reward/mean"] <= high and "env/turns" in step, step
