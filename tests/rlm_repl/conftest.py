"""Shared helpers for the skyrl-rlm-repl tests: a real tokenizer, built-in tasks, scripted policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hostile import BACKENDS, hostile_config
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_rlm_repl.evidence.dataset import load_tasks
from skyrl_rlm_repl.sandbox import Sandbox

CONTEXT_TASK = {"id": "capital", "prompt": "What is the capital of France?",
                "context": "Notes: the capital of France is Paris.", "answer": "Paris"}


def repl(*lines: str) -> str:
    """A response holding one ```repl block with these lines."""
    return "```repl\n" + "\n".join(lines) + "\n```"


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


def scripted_policy(tokenizer: Any, choose: Callable[[str, str, int], str]) -> ScriptedEngine:
    """An engine whose reply is ``choose(user_prompt, last_user_message, turn)`` for each episode.

    ``user_prompt`` is the episode's first user message (the task or sub-prompt), ``turn`` counts
    the assistant turns already in the conversation.
    """

    def reply(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        users = [part.split("<|im_end|>", 1)[0] for part in text.split("<|im_start|>user\n")[1:]]
        return choose(users[0], users[-1], text.count("<|im_start|>assistant\n") - 1)

    return ScriptedEngine(tokenizer, default=reply)


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
async def sandbox(backend):
    async with await Sandbox.create(hostile_config(backend), context="public context") as box:
        yield box
