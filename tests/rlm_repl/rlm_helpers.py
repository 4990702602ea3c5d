"""Helpers the skyrl-rlm-repl tests import: a context task, a response with a repl block, scripted policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_rlm_repl.probes import repl  # noqa: F401 - the tests' responses are the probes' own

CONTEXT_TASK = {"id": "capital", "prompt": "What is the capital of France?",
                "context": "Notes: the capital of France is Paris.", "answer": "Paris"}


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
