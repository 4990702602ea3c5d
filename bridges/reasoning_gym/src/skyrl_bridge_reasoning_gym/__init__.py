"""skyrl-bridge-reasoning-gym: every reasoning-gym dataset as a one-turn env scored by its own ``score_answer``.

This module is imported by every ``skyrl`` command: it must not import reasoning-gym.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, hookimpl

if TYPE_CHECKING:
    from skyrl_core.probe import Probe

ENV_ID = "reasoning_gym"


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id=ENV_ID,
        entry_point="skyrl_bridge_reasoning_gym.env:ReasoningGymEnv",
        config="skyrl_bridge_reasoning_gym.config:ReasoningGymConfig",
        catalog="skyrl_bridge_reasoning_gym.catalog:entries",
        description="reasoning-gym's procedural datasets (env.name, ~100): one reply with <answer>, scored by the "
                    "dataset's own score_answer.",
        max_turns=1,
        reward_range=(0.0, 1.0),
        stop=("</answer>",),
        eval_splits={"train": "test"},
    ))


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    from .probes import PROBES  # imported when the checker runs

    for probe in PROBES:
        register(probe)
