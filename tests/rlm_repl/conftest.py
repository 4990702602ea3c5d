"""Shared helpers for the skyrl-rlm-repl tests: a real tokenizer, built-in tasks, scripted policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hostile import BACKENDS, hostile_config
from rlm_helpers import CONTEXT_TASK
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_rlm_repl.evidence.dataset import load_tasks
from skyrl_rlm_repl.sandbox import Sandbox


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return make_tokenizer("chatml")


@pytest.fixture(scope="session")
def evidence_tasks() -> list[dict[str, Any]]:
    return load_tasks(split="train")


@pytest.fixture
def make_env() -> Callable[..., RLMReplEnv]:
    """``make_env(task=..., **config)`` -> a reset env, closed after the test."""
    envs: list[RLMReplEnv] = []

    def make(task: dict[str, Any] | None = None, **config: Any) -> RLMReplEnv:
        env = RLMReplEnv(task=task or CONTEXT_TASK, config=config)
        env.reset(seed=0)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
async def sandbox(backend):
    async with await Sandbox.create(hostile_config(backend), context="public context") as box:
        yield box
