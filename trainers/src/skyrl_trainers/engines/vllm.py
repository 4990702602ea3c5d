"""The ``vllm`` engine: in-process vLLM (``AsyncLLM``) on a CUDA GPU, with weight updates from the trainer.

vLLM is imported only when an engine is constructed. Without vLLM or without a CUDA GPU the
constructor raises :class:`VLLMUnavailableError` saying what is missing and what to use instead.

* Generation sends token ids (``TokensPrompt``) and asks for the sampled token's logprob only
  (``logprobs=0``); ``logprobs_mode`` picks raw or processed logprobs, as for the ``hf`` engine.
* :meth:`VLLMEngine.prompt_logprobs` scores a prompt (each token's logprob given the ones before it,
  and optionally the top-k) with one request of ``prompt_logprobs=k, max_tokens=1``.
* Weight updates go through vLLM's ``collective_rpc`` to :class:`~.vllm_worker.WeightLoaderExtension`
  (installed as ``worker_extension_cls``), which calls the model's ``load_weights``; tensors travel in
  chunks of ``weight_chunk_mb``. The prefix cache is reset afterwards so no new request reuses KV
  computed with old weights.
* In-flight updates (``in_flight_updates``, as on the ``hf`` engine): the update pauses vLLM's
  scheduler between two engine steps (``AsyncLLM.pause_generation``), loads the weights and resumes.
  ``off`` first lets the requests in flight finish (``mode="wait"``: no completion mixes versions);
  ``keep`` freezes them where they are (``mode="keep"``) and they go on with the new weights over
  their KV cache; ``recompute`` also preempts them (``reset_prefix_cache(reset_running_requests=True)``)
  so vLLM recomputes prompt + tokens so far with the new weights and drops output sampled but not yet
  sent. Outputs stream as deltas, and each token is stamped with the version whose weights were
  loaded when it reached this process; the version moves only after the scheduler has paused and
  the weights are in, so a token sampled before the pause is counted as the old version (vLLM returns
  a paused step's outputs before ``pause_generation`` returns).
* Colocated with a trainer on the same GPU, set ``enable_sleep_mode=True`` and call :meth:`sleep`
  before training and :meth:`wake_up` after; :meth:`update_weights` wakes the weights (not the KV
  cache) itself when the engine is asleep.
* vLLM's async engine is tied to the event loop it started on, so it runs on its own loop in a
  background thread; callers may use any loop (e.g. one ``asyncio.run`` per training step).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import math
import threading
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams, StopReason

from skyrl_trainers.engines.sampling import LogprobMode

T = TypeVar("T")
log = logging.getLogger(__name__)
WORKER_EXTENSION = "skyrl_trainers.engines.vllm_worker.WeightLoaderExtension"
LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}
FINISH_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length", "abort": "abort"}
SLEEP_TAGS = ("weights", "kv_cache")


class VLLMUnavailableError(EngineError):
    """vLLM or a CUDA GPU is missing; the message lists what and how to fix it."""


class VLLMEngineConfig(BaseModel):
    """Options of the ``vllm`` engine (section ``engine`` of a run config)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field("smollm2-135m", description="Built-in name (tiny-random, smollm2-135m), HF hub id or folder.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="Weights' dtype; auto: the "
                                                                      "model's own.")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="Fraction of GPU memory vLLM may take "
                                          "(leave room for the trainer when colocated).")
    max_model_len: int | None = Field(4096, ge=16, description="Context length; None uses the model's.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine shards the model over.")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV cache of shared prompt prefixes (a GRPO "
                                        "group's prompt, earlier turns).")
    enable_sleep_mode: bool = Field(False, description="Allow sleep()/wake_up() to free GPU memory for training.")
    enforce_eager: bool = Field(False, description="Skip CUDA graphs (faster start, slower decode).")
    logprobs_mode: LogprobMode = Field("processed", description="processed: under the sampling distribution; "
                                       "raw: of the unmodified model.")
    weight_chunk_mb: int = Field(512, ge=1, description="Size of each weight-update message to the workers.")
    in_flight_updates: Literal["off", "keep", "recompute"] = Field(
        "off", description="What a weight update does to requests decoding: off waits until they finish; keep "
        "pauses them between engine steps and they go on with the new weights over their KV cache; recompute "
        "pauses them and recomputes their KV with the new weights. keep/recompute need a vLLM whose "
        "AsyncLLM.pause_generation takes mode=.")
    seed: int = Field(0, description="Seeds requests that bring no seed of their own.")
    extra_engine_args: dict[str, Any] = Field(default_factory=dict,
                                              description="More vllm.AsyncEngineArgs fields, passed as is.")
    replicas: int = Field(1, ge=1, description="Copies of the engine, each in its own Ray actor (with its own GPU "
                          "on CUDA), behind one client that routes requests by load and keeps a session (an episode) "
                          "on one replica; weight updates reach all of them. >1 needs trainer.engine_placement=ray.")


def check_vllm_available() -> None:
    """Raise :class:`VLLMUnavailableError` naming everything that is missing."""
    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append("the vllm package is not installed (pip install 'skyrl-trainers[vllm]', Linux with CUDA)")
    import torch

    if not torch.cuda.is_available():
        problems.append("torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    if problems:
        raise VLLMUnavailableError("the vllm engine cannot start: " + "; ".join(problems)
                                   + ". To generate with transformers instead (CPU or GPU), use the hf engine: the "
                                   "override engine.id=hf (`skyrl rollout`/`skyrl eval`: --engine hf)")


class VLLMEngine:
    """vLLM behind skyrl-core's ``InferenceEngine`` protocol. Safe to call concurrently from any loop.

    ``llm`` is for an ``AsyncLLM`` built elsewhere (or a stand-in with its methods, as the CPU tests
    use); by default the constructor starts vLLM itself.
    """

    def __init__(self, config: VLLMEngineConfig | None = None, llm: Any = None) -> None:
        if llm is None:
            check_vllm_available()
        from skyrl_trainers.models import ModelLoadError, load_tokenizer, model_source

        self.config = config = config or VLLMEngineConfig()
        try:
            self.tokenizer = load_tokenizer(config.model)
            source = model_source(config.model)
        except ModelLoadError as exc:
            raise EngineError(f"vllm engine: {exc}") from exc
        self.weight_version = 0
        self.asleep: set[str] = set()  # what sleep() released and wake_up() has not restored yet
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self._llm = llm if llm is not None else self._call(self._start(source))
        self._pause_modes = "mode" in inspect.signature(self._llm.pause_generation).parameters
        if config.in_flight_updates != "off" and not self._pause_modes:
            self.close()
            raise VLLMUnavailableError(
                f"engine.in_flight_updates={config.in_flight_updates} needs a vLLM whose AsyncLLM.pause_generation "
                "takes mode= (pausing with requests kept); upgrade vllm or set engine.in_flight_updates=off")

    @property
    def in_flight_updates(self) -> str:
        """``off``, ``keep`` or ``recompute`` (``VLLMEngineConfig.in_flight_updates``)."""
        return self.config.in_flight_updates

    async def _start(self, source: str) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        args = AsyncEngineArgs(
            model=source, tokenizer=source, dtype=c.dtype, seed=c.seed,
            gpu_memory_utilization=c.gpu_memory_utilization, max_model_len=c.max_model_len,
            tensor_parallel_size=c.tensor_parallel_size, enable_prefix_caching=c.enable_prefix_caching,
            enable_sleep_mode=c.enable_sleep_mode, enforce_eager=c.enforce_eager,
            logprobs_mode=LOGPROBS_MODES[c.logprobs_mode], worker_extension_cls=WORKER_EXTENSION,
            **c.extra_engine_args)
        return AsyncLLM.from_engine_args(args)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        return await self._submit(self._generate(list(prompt_ids), params))

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        await self._submit(self._update_weights(named_tensors))

    async def prompt_logprobs(self, prompt_ids: list[int], topk: int = 0
                              ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
        """``log p(prompt[t] | prompt[:t])`` of the model as is (vLLM computes prompt logprobs from the
        raw logits, whatever ``logprobs_mode``), NaN at ``t = 0``; with ``topk`` also the
        ``[len(prompt), topk]`` most likely ids (int64) and their logprobs (float32), best first, row 0
        padded with id 0 and ``-inf`` (the same shapes as ``HFEngine.prompt_logprobs``).

        One request with ``prompt_logprobs=max(topk, 1)`` and ``max_tokens=1`` (vLLM reads no prefix
        cache for such a request, so the whole prompt is computed with the weights loaded now).
        """
        if not prompt_ids:
            raise EngineError("vllm engine: prompt_ids is empty")
        return await self._submit(self._prompt_logprobs([int(i) for i in prompt_ids], topk))

    async def sleep(self, level: int = 1) -> None:
        """Free GPU memory: level 1 offloads weights to CPU and drops the KV cache; level 2 drops both
        (the weights must then be reloaded with :meth:`update_weights` before generating again)."""
        if not self.config.enable_sleep_mode:
            raise EngineError("vllm engine: sleep() needs engine.enable_sleep_mode=true")
        await self._submit(self._llm.sleep(level))
        self.asleep = set(SLEEP_TAGS)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore GPU memory; ``tags`` may be ``["weights"]`` or ``["kv_cache"]`` (default: both)."""
        wanted = [t for t in (tags or SLEEP_TAGS) if t in self.asleep]
        if wanted:
            await self._submit(self._llm.wake_up(wanted))
            self.asleep -= set(wanted)

    def close(self) -> None:
        self._llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        version = self.weight_version
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        text: list[str] = []
        finish_reason = None
        async for output in self._llm.generate(self._prompt(prompt_ids), self._sampling(params),
                                               request_id=uuid.uuid4().hex):
            for delta in output.outputs[:1]:  # n=1; DELTA outputs carry only what is new since the last one
                new = list(delta.token_ids)
                token_ids += new
                logprobs += [step[token].logprob for token, step in zip(new, delta.logprobs or [], strict=False)]
                versions += [self.weight_version] * len(new)
                text.append(delta.text or "")
                finish_reason = delta.finish_reason or finish_reason
        if finish_reason is None and not token_ids:
            raise EngineError("vllm engine: the request finished without output")
        reason = FINISH_REASONS.get(str(finish_reason), "stop")
        return GenerateOutput(token_ids, logprobs if len(logprobs) == len(token_ids) else None, reason,
                              "".join(text), metadata={"weight_version": version}, weight_versions=versions)

    async def _prompt_logprobs(self, prompt_ids: list[int], topk: int
                               ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
        final = None
        async for output in self._llm.generate(self._prompt(prompt_ids), self._scoring(max(topk, 1)),
                                               request_id=uuid.uuid4().hex):
            final = output  # FINAL_ONLY: one output, carrying the prompt logprobs of every prefill chunk
        scored = None if final is None else final.prompt_logprobs
        if scored is None or len(scored) != len(prompt_ids):
            raise EngineError(f"vllm engine: asked for the logprobs of a {len(prompt_ids)}-token prompt, got "
                              f"{'none' if scored is None else len(scored)}")
        return read_prompt_logprobs(prompt_ids, scored, topk)

    def _prompt(self, prompt_ids: list[int]) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=prompt_ids)

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VLLMSamplingParams(
            n=1, max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1, stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids) or None, ignore_eos=params.ignore_eos,
            include_stop_str_in_output=True,
            seed=params.seed, logprobs=0, skip_special_tokens=False, output_kind=RequestOutputKind.DELTA)

    def _scoring(self, num_logprobs: int) -> Any:
        """A request that only scores its prompt. ``prompt_logprobs`` is at least 1: some vLLM versions
        treat 0 as off; the top entries it adds are ignored when ``topk`` is 0."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VLLMSamplingParams(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=num_logprobs,
                                  detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)

    async def _update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        if "weights" in self.asleep:
            await self._llm.wake_up(["weights"])
            self.asleep.discard("weights")
        mode = self.config.in_flight_updates
        if self._pause_modes:  # older vLLMs cannot pause: the update then lands between engine steps as is
            await self._llm.pause_generation(mode="wait" if mode == "off" else "keep", clear_cache=False)
        try:
            for chunk in chunk_named_tensors(named_tensors, self.config.weight_chunk_mb * 2**20):
                await self._llm.collective_rpc("skyrl_load_weights", args=(chunk,))
            if mode == "recompute":
                await self._llm.reset_prefix_cache(reset_running_requests=True)
            elif not await self._llm.reset_prefix_cache():
                log.warning("vllm engine: the prefix cache could not be reset (requests hold it); new requests may "
                            "reuse prompt KV computed by the previous weights until they finish")
            self.weight_version += 1
        finally:
            if self._pause_modes:
                await self._llm.resume_generation()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))


def read_prompt_logprobs(prompt_ids: list[int], scored: Any, topk: int
                         ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
    """``RequestOutput.prompt_logprobs`` as :meth:`VLLMEngine.prompt_logprobs` returns it.

    ``scored`` is what vLLM returns (``PromptLogprobs`` in vllm/logprobs.py, filled by
    vllm/v1/engine/logprobs.py): a sequence with one entry per prompt token, ``None`` for the first,
    then ``{token_id: Logprob(logprob, rank, decoded_token)}`` holding the prompt token (with its rank
    in the vocabulary) and the ``prompt_logprobs`` most likely tokens (ranks 1..k); the prompt token is
    an extra entry only when it is not among them. Entries are taken by logprob, not by dict order.
    """
    n = len(prompt_ids)
    logprobs = [math.nan]
    top_ids = np.zeros((n, topk), np.int64)
    top_lps = np.full((n, topk), -np.inf, np.float32)
    for t in range(1, n):
        entries = scored[t]
        logprobs.append(float(entries[prompt_ids[t]].logprob))
        if topk:
            best = sorted(entries.items(), key=lambda item: item[1].logprob, reverse=True)[:topk]
            top_ids[t, :len(best)] = [token for token, _ in best]
            top_lps[t, :len(best)] = [entry.logprob for _, entry in best]
    return logprobs, ((top_ids, top_lps) if topk else None)


def chunk_named_tensors(named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]],
                        max_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``max_bytes`` (a bigger tensor goes alone).

    Tensors are moved to CPU and made contiguous so they serialise to vLLM's worker processes;
    sharded ``DTensor`` values are gathered first (a collective: call it on every trainer rank).
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in items:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk
