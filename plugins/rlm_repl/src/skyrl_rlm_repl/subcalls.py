"""Sub-call requests from model code (``llm_query``, ``rlm_query`` and their batched forms).

The sandbox forwards each call as ``(method, params)`` to an async :data:`SubcallHandler`; whoever
runs the env injects one (the ``rlm_tree`` generator does). Replies are what the model's code gets:
a string (or a list, one entry per prompt, for the batched forms). Failures are replies too,
strings starting with ``"Error:"``, so a refused or failed call never raises inside the sandbox
and never hangs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

SubcallHandler = Callable[[str, dict[str, Any]], Awaitable[Any]]
SUBCALL_METHODS = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched")
NO_TREE_MESSAGE = ("Error: {method} is unavailable: sub-calls need generator rlm_tree "
                   "(run with generator.id=rlm_tree).")


class SubcallError(ValueError):
    """A sub-call request is malformed (wrong method, argument types or lengths)."""


@dataclass(frozen=True)
class SubcallRequest:
    """One sub-call, normalised: one prompt per entry, with its context (``None``: the caller's)."""

    method: str
    prompts: tuple[str, ...]
    contexts: tuple[Any, ...]

    @property
    def batched(self) -> bool:
        return self.method.endswith("_batched")

    @property
    def recursive(self) -> bool:
        return self.method.startswith("rlm_")

    def reply(self, answers: Sequence[Any]) -> Any:
        """What the calling code receives: the single answer, or the list for batched calls."""
        return list(answers) if self.batched else answers[0]

    def refuse(self, message: str) -> Any:
        """The same error string for every prompt of the request."""
        return self.reply([message] * len(self.prompts))


def parse_request(method: str, params: dict[str, Any]) -> SubcallRequest:
    """Validate ``params`` for ``method``; raises :class:`SubcallError` naming the bad argument."""
    if method not in SUBCALL_METHODS:
        raise SubcallError(f"unknown sub-call {method!r}; known: {', '.join(SUBCALL_METHODS)}")
    if method.endswith("_batched"):
        prompts = params.get("prompts")
        if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
            raise SubcallError(f"{method}(prompts, ...): prompts must be a list of strings")
        contexts = params.get("context_list")
        if contexts is None:
            contexts = [None] * len(prompts)
        elif not isinstance(contexts, (list, tuple)) or len(contexts) != len(prompts):
            raise SubcallError(f"{method}: context_list must be a list with one entry per prompt "
                               f"({len(prompts)} prompts, got {_length(contexts)} contexts)")
        return SubcallRequest(method, tuple(prompts), tuple(contexts))
    prompt = params.get("prompt")
    if not isinstance(prompt, str):
        raise SubcallError(f"{method}(prompt): prompt must be a string, got {type(prompt).__name__}")
    return SubcallRequest(method, (prompt,), (params.get("context"),))


def _length(value: Any) -> str:
    return str(len(value)) if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"


async def no_subcalls(method: str, params: dict[str, Any]) -> Any:
    """The handler of an env run outside ``rlm_tree``: every call gets an explanatory error string."""
    message = NO_TREE_MESSAGE.format(method=method)
    try:
        return parse_request(method, params).refuse(message)
    except SubcallError:
        return message
