"""An inference engine that replays canned turns: for tests, benchmarks and conformance checks."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from skyrl_core.chat import ChatTokenizer
from skyrl_core.engine import GenerateOutput, SamplingParams

Reply = str | Callable[[list[int]], str]


class ScriptedEngine:
    """Answers each ``generate`` call with the next queued reply, tokenised with ``tokenizer``.

    A reply is a string or a function of the prompt ids. When the queue is empty, ``default``
    is used (a string or function), or an error is raised. The end-of-turn id is appended unless
    the reply is cut by ``max_tokens``. ``latency`` adds an ``asyncio.sleep`` per call.
    """

    def __init__(self, tokenizer: ChatTokenizer, replies: Iterable[Reply] = (), *, default: Reply | None = None,
                 logprob: float = -0.25, latency: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.queue: deque[Reply] = deque(replies)
        self.default = default
        self.logprob = logprob
        self.latency = latency
        self.calls: list[list[int]] = []
        self.weight_updates = 0

    def enqueue(self, *replies: Reply) -> None:
        self.queue.extend(replies)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        self.calls.append(list(prompt_ids))
        if self.latency:
            await asyncio.sleep(self.latency)
        reply = self.queue.popleft() if self.queue else self.default
        if reply is None:
            raise RuntimeError("ScriptedEngine has no reply queued")
        text = reply(prompt_ids) if callable(reply) else reply
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        stop_ids = params.stop_token_ids or [self.tokenizer.eos_token_id]
        ids.append(stop_ids[0])
        reason = "stop"
        if len(ids) > params.max_tokens:
            ids, reason = ids[: params.max_tokens], "length"
        return GenerateOutput(ids, [self.logprob] * len(ids), reason, text)

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        self.weight_updates += 1


class GatedEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` that holds every call whose prompt contains ``marker`` (e.g. a phrase of
    the env's observations: the call of a second turn, made while the episode's env is live) until
    ``gate`` is set; ``held`` counts the calls held so far. For tests that act while episodes are mid-way."""

    def __init__(self, tokenizer: ChatTokenizer, replies: Iterable[Reply] = (), *, marker: str,
                 **kwargs: Any) -> None:
        super().__init__(tokenizer, replies, **kwargs)
        self.marker, self.gate, self.held = marker, asyncio.Event(), 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        if not self.gate.is_set() and self.marker in self.tokenizer.decode(prompt_ids):
            self.held += 1
            await self.gate.wait()
        return await super().generate(prompt_ids, params)
