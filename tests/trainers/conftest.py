"""Fixtures for the trainer tests: small run configs with ``tiny-random`` and the test envs."""

from __future__ import annotations

from typing import Any

import pytest
from skyrl_core.config import ResolvedConfig, build_config, merge
from skyrl_core.plugins import get_registry

SMALL_RUN = {
    "engine": {"id": "hf", "max_batch_size": 16},
    "generator": {"n_samples_per_prompt": 2, "max_tokens_per_turn": 6, "max_total_tokens": 12},
    "trainer": {"id": "fsdp_grpo", "model": "tiny-random", "steps": 2, "batch_size": 2, "lr": 1e-3,
                "micro_batch_tokens": 512},
    "run": {"console": False},
}


@pytest.fixture
def extra_envs(register_skyrl_plugin):
    from trainer_support import TrainerTestEnvs

    register_skyrl_plugin(TrainerTestEnvs(), name="trainer-test-envs")


@pytest.fixture
def run_config(tmp_path):
    """``run_config(env="reverse_text", trainer={...}, run={...})`` -> a ResolvedConfig in ``tmp_path/run``."""

    def make(env: str = "reverse_text", **sections: dict[str, Any]) -> ResolvedConfig:
        layers = merge(SMALL_RUN, {"env": {"id": env}, "run": {"output_dir": str(tmp_path / "run")}})
        return build_config(merge(layers, sections), registry=get_registry())

    return make
