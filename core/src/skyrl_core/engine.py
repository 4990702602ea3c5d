"""The inference-engine protocol shared by ``hf``, ``vllm``, ``openai`` and test engines.

Engines work on token ids: ``generate`` takes the full context as ids and returns exactly the ids
it sampled, with one logprob per id, so trajectories never depend on re-tokenising text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

StopReason = Literal["stop", "length", "abort"]


class SamplingParams(BaseModel):
    """Sampling options understood by every engine (engines ignore what they cannot honour)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=1, description="Upper bound on generated tokens for this call.")
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 disables top-k.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (kept in the output).")
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra stop ids besides EOS.")
    seed: int | None = None


@dataclass
class GenerateOutput:
    """Generated ids (including the stop token when one was sampled) and their logprobs."""

    token_ids: list[int]
    logprobs: list[float] | None
    stop_reason: StopReason
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class InferenceEngine(Protocol):
    """What generators need from an engine. Implementations must be safe to call concurrently."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        """Continue ``prompt_ids``; never return more than ``params.max_tokens`` ids."""
        ...

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load new policy weights (called by trainers after every optimizer step)."""
        ...


class EngineError(RuntimeError):
    """An engine could not produce a completion (after its retries)."""
