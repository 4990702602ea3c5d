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
                "micro_batch_tokens": 512, "eval_samples": 0},  # evaluation: test_held_out_eval.py
    "run": {"console": False},
}


@pytest.fixture(scope="module")
def one_cpu_thread():
    """Decode with one intra-op thread: on a busy 2-core machine, 2-thread OpenMP regions stall for
    tens of milliseconds per step (a 300-token decode goes from 0.4 s to 15 s). Restored afterwards.
    Engine test modules use it with ``pytestmark = pytest.mark.usefixtures("one_cpu_thread")``."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tiny():
    """The tiny-random model and tokenizer (built once per module; tests copy the model before changing it)."""
    from skyrl_trainers.models import build_tiny_random

    return build_tiny_random()


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


@pytest.fixture
def this_cpu(monkeypatch):
    """Pretend this CPU has the given bf16 instructions and probe ratio; ``auto`` decides afresh and the probes
    it runs are counted."""
    from skyrl_trainers import precision

    probes: list[float] = []

    def pretend(feature: str | None, speedup: float = 0.0) -> list[float]:
        monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: feature)
        monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: probes.append(speedup) or speedup)
        precision.cpu_auto_precision.cache_clear()
        return probes

    yield pretend
    precision.cpu_auto_precision.cache_clear()  # later tests see this CPU's own decision
