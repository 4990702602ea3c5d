"""End to end: `skyrl run --env textarena --trainer fsdp_grpo` on tiny-random, two GRPO steps on GuessTheNumber-v0."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_skyrl_run_trains_on_a_textarena_game_with_tiny_random(train_two_steps):
    pytest.importorskip("textarena")
    run = train_two_steps("textarena", "env.name=GuessTheNumber-v0", "env.max_turns=2")
    for step in run.steps:
        assert 0.0 <= step["reward/mean"] <= 1.0, step
        assert "env/invalid_moves" in step and "env/success" in step
