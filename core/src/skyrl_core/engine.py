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
    ignore_eos: bool = Field(False, description="Decode past EOS (until max_tokens, a stop string or a stop id).")
    seed: int | None = None
    session_id: str | None = Field(
        None, description="Requests of one session (a multi-turn episode) go to the same engine replica, whose "
        "prefix cache holds its context; engines with one replica ignore it.")


@dataclass
class GenerateOutput:
    """Generated ids (including the stop token when one was sampled) and their logprobs.

    ``weight_versions`` (aligned with ``token_ids``) is the policy version that produced each token,
    for engines whose weights may change while a request decodes (see ``in_flight_updates`` on
    :class:`InferenceEngine`); ``None`` means every token came from ``metadata["weight_version"]``
    (the version at admission), or that the version is unknown when that key is absent too.
    """

    token_ids: list[int]
    logprobs: list[float] | None
    stop_reason: StopReason
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_versions: list[int] | None = None


@runtime_checkable
class InferenceEngine(Protocol):
    """What generators need from an engine. Implementations must be safe to call concurrently.

    Optional capability attribute ``in_flight_updates`` (a str) says what ``update_weights`` does to
    requests that are decoding when it is called:

    * ``"off"``: no in-flight updates; the update waits for the requests in flight (``hf``), or the
      engine does not tell versions apart within a request. Every token of a completion is the
      version in ``metadata["weight_version"]``.
    * ``"keep"``: the update lands between two decode steps; requests in flight keep their KV cache
      (computed by the old weights) and continue with the new weights.
    * ``"recompute"``: as ``keep``, but requests in flight are re-prefilled with the new weights, so
      from the update on every token is the new policy's.

    With ``keep``/``recompute`` a completion may span versions and ``GenerateOutput.weight_versions``
    says which produced each token. Engines without the attribute are treated as ``"off"``.
    """

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        """Continue ``prompt_ids``; never return more than ``params.max_tokens`` ids."""
        ...

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load new policy weights (called by trainers after every optimizer step)."""
        ...


# -- optional capabilities: what a trainer uses where the engine has it (checked with isinstance) -----------


@runtime_checkable
class TokenizingEngine(Protocol):
    """An engine that carries the tokenizer of its model (``hf``, ``vllm``; ``openai`` when it knows one, else
    ``None``). A trainer builds its prompts with it."""

    tokenizer: Any


@runtime_checkable
class ClosableEngine(Protocol):
    """An engine that holds something to release (a model on a GPU, a child process, Ray actors)."""

    def close(self) -> None:
        """Free what the engine holds; it generates no more."""
        ...


@runtime_checkable
class SleepableEngine(Protocol):
    """An engine that can free its GPU memory while the trainer trains (vLLM's sleep mode)."""

    async def sleep(self, level: int = 1) -> None:
        """Free GPU memory: level 1 offloads the weights to the CPU and drops the KV cache, level 2 drops both."""
        ...

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the memory back, ``tags`` (``"weights"``, ``"kv_cache"``) only, or all of it."""
        ...


@runtime_checkable
class MemoryReleasingEngine(Protocol):
    """An engine with caches that go stale when its weights change (the ``hf`` engine's packed weights)."""

    async def release_memory(self) -> None:
        """Drop those caches (they are rebuilt on the next ``generate``)."""
        ...


@runtime_checkable
class ReportingEngine(Protocol):
    """An engine that reports about itself for each training step's metrics (e.g. requests per replica)."""

    def engine_metrics(self) -> Mapping[str, float]:
        """Flat ``{"engine/<name>": value}`` numbers, logged with the step."""
        ...


class EngineError(RuntimeError):
    """An engine could not produce a completion (after its retries)."""
