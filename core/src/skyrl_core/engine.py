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


class EngineError(RuntimeError):
    """An engine could not produce a completion (after its retries)."""
