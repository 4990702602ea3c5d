"""Sampling through one of our engines (``hf``, or ``vllm`` on a GPU), from the base model or from
base + a LoRA adapter merged.

The engine holds one plain copy of the base model. A sampler keeps its adapter's small LoRA factors
(taken when it was saved); before requests for it run, the engine's adapted linears are set to
``base + (alpha / rank) B @ A`` through the engine's ``update_weights`` (skipped when that sampler is
already loaded). The tensors are keyed by the base model's Hugging Face parameter names
(``model.layers.0.self_attn.q_proj.weight``): the ``hf`` engine copies them into its model; the
``vllm`` engine hands them to vLLM's ``load_weights``, which reads checkpoint (= Hugging Face) names
and maps them onto its fused layers (``qkv_proj``, ``gate_up_proj``). Requests for the loaded sampler
go to the engine as they come and decode together in its batcher (the ``hf`` engine gathers a burst of
them before it starts); a request for another sampler waits until
those in flight are done, then the weights are swapped.
Fair share: requests wait in a queue per tenant, and tenants take turns. No more than ``max_rows``
samples are in flight; once there is room, a turn starts the next tenant's leading requests for one
sampler that fit it (the first always). So one tenant's flood delays another's request by about
``max_rows`` samples, not the whole flood (the engine would otherwise decode the flood's rows first,
in arrival order).
Logprobs are the model's raw log-softmax (``logprobs_mode="raw"``) whatever the temperature, the
same quantity the engine's ``prompt_logprobs`` computes, so ``compute_logprobs`` on sampled tokens
reproduces the logprobs returned with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from skyrl_core.engine import GenerateOutput, SamplingParams
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.engines.vllm import VLLMEngine, VLLMEngineConfig
from skyrl_trainers.models import load_model_and_tokenizer

from skyrl_tinker.backend import LORA_ALPHA
from skyrl_tinker.futures import Future, FutureStore
from skyrl_tinker.wire import MASK_LOGPROB, encode_sample_response

log = logging.getLogger(__name__)

MAX_ROWS = 256  # samples in flight at once (the hf engine decodes 64 at a time; vLLM batches more)


@dataclass(frozen=True)
class SamplerWeights:
    """What a sampling session samples from: ``key`` names it; ``adapter`` (peft's saved-adapter
    naming) is empty for the base model."""

    key: str
    adapter: Mapping[str, torch.Tensor]
    rank: int = 1

    def deltas(self) -> dict[str, torch.Tensor]:
        """``(alpha / rank) * B @ A`` per adapted linear, keyed by the base model's weight names."""
        scale = LORA_ALPHA / self.rank
        out = {}
        for key, a in self.adapter.items():
            if key.endswith(".lora_A.weight"):
                module = key.removesuffix(".lora_A.weight")
                b = self.adapter[f"{module}.lora_B.weight"]
                out[module.removeprefix("base_model.model.") + ".weight"] = (b.float() @ a.float()) * scale
        return out


@dataclass
class SampleJob:
    future: Future
    weights: SamplerWeights
    prompt: list[int]
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool
    prompt_logprobs_last_n: int | None = None
    topk_prompt_logprobs: int = 0


class SamplingEngine(Protocol):
    """What the sampler needs of an engine (``HFEngine`` and ``VLLMEngine`` both provide it)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput: ...

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None: ...

    async def prompt_logprobs(self, prompt_ids: list[int], topk: int = 0
                              ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]: ...

    def close(self) -> None: ...


SamplerEngineKind = Literal["hf", "vllm"]


def vllm_sampler_config(base_model: str, *, gpu_memory_utilization: float, max_logprobs: int) -> VLLMEngineConfig:
    """The ``vllm`` engine's settings for sampling beside the trainer (on the same GPU).

    * ``logprobs_mode="raw"``: the logprobs of the unmodified model, as the ``hf`` sampler returns them
      and as vLLM computes prompt logprobs, so ``compute_logprobs`` agrees with sampled logprobs.
    * ``dtype="bfloat16"``: the dtype the trainer's model has on CUDA, so the sampler's logprobs are the
      trainer's (vLLM's ``auto`` would turn a float32 checkpoint into float16).
    * ``gpu_memory_utilization``: vLLM reserves that share of the GPU up front; the rest stays for the
      trainer's model, adapters, optimizer states and activations.
    * ``max_model_len=None``: the model's own context, the limit requests are validated against.
    * ``max_logprobs``: vLLM refuses more prompt logprobs per token than this (its default is 20; the
      Tinker API allows up to ``MAX_TOPK``).
    * ``in_flight_updates="off"``: the sampler swaps weights only once the requests in flight are done.
    * CUDA graphs stay on (no ``enforce_eager``): they make decoding small batches several times faster,
      and loading weights copies into the same tensors, so the captured graphs stay valid.
    * prefix caching stays on (samples of one prompt share it); each weight swap resets it.
    """
    return VLLMEngineConfig(model=base_model, dtype="bfloat16", logprobs_mode="raw",
                            gpu_memory_utilization=gpu_memory_utilization, max_model_len=None,
                            in_flight_updates="off", extra_engine_args={"max_logprobs": max_logprobs})


def build_sampler_engine(kind: SamplerEngineKind, base_model: str, *, device: str = "cpu", max_batch_size: int = 64,
                         gpu_memory_utilization: float = 0.4, max_logprobs: int = 64) -> SamplingEngine:
    """The sampling engine: ``hf`` (transformers on ``device``) or ``vllm`` (on the first visible GPU,
    whatever ``device``; raises ``VLLMUnavailableError`` naming what is missing when vLLM or CUDA is)."""
    if kind == "hf":
        model, tokenizer = load_model_and_tokenizer(base_model, device=device)
        # A client's concurrent samples arrive a few ms apart (one HTTP request each): gather them while
        # they keep coming (gaps under 10 ms, 250 ms at most) so they decode as one batch; rows joining a
        # running batch one by one cost a prefill and a cache merge each (on smollm2-135m, 32 samples took
        # 1.35 s that way against 1.05 s started together).
        # float32 packing: training clients compute logprobs in float32, and a sample's logprobs must equal them
        return HFEngine.from_model(model, tokenizer, HFEngineConfig(
            max_batch_size=max_batch_size, batch_wait_ms=10.0, batch_wait_max_ms=250.0, logprobs_mode="raw",
            packed_dtype="float32"))
    if kind == "vllm":
        return VLLMEngine(vllm_sampler_config(base_model, gpu_memory_utilization=gpu_memory_utilization,
                                              max_logprobs=max_logprobs))
    raise ValueError(f"unknown sampler engine {kind!r}: use hf or vllm")


class Sampler:
    """Owns the engine (and closes it on :meth:`stop`) and a thread running the sampler's event loop."""

    def __init__(self, engine: SamplingEngine, base_linear_weights: Mapping[str, torch.Tensor],
                 futures: FutureStore, max_rows: int = MAX_ROWS) -> None:
        self.engine = engine
        self.base = base_linear_weights
        self.futures = futures
        self.max_rows = max_rows
        self._loaded_key = "base"
        self._loaded_names: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._waiting: dict[str, deque[SampleJob]] = {}  # tenant -> its jobs in arrival order (on the loop)
        self._arrived: asyncio.Event | None = None
        self._running: dict[str, asyncio.Task[None]] = {}  # request id -> its job (on the sampler's loop)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="tinker-sample", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def stop(self) -> None:
        async def cancel() -> None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

        asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self.engine.close()

    def submit(self, job: SampleJob) -> None:
        self._loop.call_soon_threadsafe(self._enqueue, job)

    def _enqueue(self, job: SampleJob) -> None:
        assert self._arrived is not None
        self._waiting.setdefault(job.future.tenant, deque()).append(job)
        self._arrived.set()

    def cancel(self, request_id: str) -> None:
        """Stop a running request: its rows leave the engine's batch at the next step. The caller settles
        its future first, so a job not yet started is skipped instead."""
        def cancel_job() -> None:
            task = self._running.get(request_id)
            if task is not None:
                task.cancel()

        self._loop.call_soon_threadsafe(cancel_job)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._arrived = asyncio.Event()
        self._task = self._loop.create_task(self._consume())
        self._ready.set()
        self._loop.run_forever()

    async def _consume(self) -> None:
        """Start the tenants' turns as they come; a turn for other weights first waits for the requests
        in flight to finish, then swaps the weights (so no sample ever mixes two samplers' weights)."""
        assert self._arrived is not None
        in_flight: dict[asyncio.Task[None], int] = {}  # running job -> its samples
        while True:
            while in_flight and sum(in_flight.values()) >= self.max_rows:
                await asyncio.wait(set(in_flight), return_when=asyncio.FIRST_COMPLETED)
            turn = self._next_turn(self.max_rows - sum(in_flight.values()))
            if turn:
                await self._start_turn(turn, in_flight)
            else:
                self._arrived.clear()
                await self._arrived.wait()

    async def _start_turn(self, turn: list[SampleJob], in_flight: dict[asyncio.Task[None], int]) -> None:
        """Swap the weights if the turn's are not loaded, then start its requests as room frees (a
        helper, so that no job of it stays referenced, and its weights alive, once it is done)."""
        if turn[0].weights.key != self._loaded_key:
            if in_flight:
                await asyncio.wait(set(in_flight))
            try:
                await self._load(turn[0].weights)
            except Exception as exc:  # a broken weight set fails its requests, not the sampler
                log.exception("loading sampler weights failed")
                for job in turn:
                    self.futures.fail(job.future, f"internal error: {type(exc).__name__}: {exc}", "server")
                return
        for job in turn:
            while in_flight and sum(in_flight.values()) + job.num_samples > self.max_rows:
                await asyncio.wait(set(in_flight), return_when=asyncio.FIRST_COMPLETED)
            if not job.future.done:  # else cancelled (or its session reaped) before it started
                self._start(job, in_flight)

    def _next_turn(self, room: int) -> list[SampleJob]:
        """The next tenant's leading requests for one set of weights, up to ``room`` samples (the first
        always); that tenant then waits for every other tenant's turn. Settled requests are skipped."""
        for tenant in list(self._waiting):
            jobs = self._waiting.pop(tenant)
            while jobs and jobs[0].future.done:
                jobs.popleft()
            if not jobs:
                continue
            turn = [jobs.popleft()]
            rows = turn[0].num_samples
            while jobs and jobs[0].weights.key == turn[0].weights.key and rows + jobs[0].num_samples <= room:
                rows += jobs[0].num_samples
                turn.append(jobs.popleft())
            if jobs:
                self._waiting[tenant] = jobs
            return turn
        return []

    def _start(self, job: SampleJob, in_flight: dict[asyncio.Task[None], int]) -> None:
        task = asyncio.create_task(self._run_job(job))
        in_flight[task] = job.num_samples
        task.add_done_callback(lambda _: in_flight.pop(task, None))
        self._running[job.future.request_id] = task
        task.add_done_callback(lambda _, request_id=job.future.request_id: self._running.pop(request_id, None))

    async def _run_job(self, job: SampleJob) -> None:
        try:
            sequences = await self._generate(job)
            prompt_lp = topk = None
            if job.prompt_logprobs or job.topk_prompt_logprobs:
                prompt_lp, topk = await self.prompt_logprobs(job.prompt, job.topk_prompt_logprobs)
                if job.prompt_logprobs_last_n is not None:
                    unscored = len(prompt_lp) - job.prompt_logprobs_last_n
                    prompt_lp[:unscored] = [math.nan] * unscored
                    if topk is not None:
                        topk[0][:unscored], topk[1][:unscored] = 0, MASK_LOGPROB
            self.futures.finish(job.future, encode_sample_response(
                sequences, prompt_lp if job.prompt_logprobs else None, topk))
        except ValueError as exc:
            self.futures.fail(job.future, str(exc), "user")
        except Exception as exc:  # reported to the client; the sampler goes on
            log.exception("sampling failed")
            self.futures.fail(job.future, f"internal error: {type(exc).__name__}: {exc}", "server")

    async def _generate(self, job: SampleJob) -> list[tuple[str, list[int], list[float]]]:
        calls = []
        for i in range(job.num_samples):
            params = job.params
            if params.seed is not None and i:
                params = params.model_copy(update={"seed": params.seed + i})
            calls.append(self.engine.generate(job.prompt, params))
        outs = await asyncio.gather(*calls)
        return [(o.stop_reason, list(o.token_ids), list(o.logprobs or [])) for o in outs]

    async def _load(self, weights: SamplerWeights) -> None:
        """Put ``base + deltas`` into the engine for every linear that this or the last sampler adapts."""
        if weights.key == self._loaded_key:
            return
        deltas = weights.deltas()
        update = {}
        for name in self._loaded_names | set(deltas):
            base = self.base[name]
            delta = deltas.get(name)
            update[name] = base if delta is None else base + delta.to(base.device, base.dtype)
        await self.engine.update_weights(update)
        self._loaded_key, self._loaded_names = weights.key, set(deltas)

    async def prompt_logprobs(self, prompt: list[int], topk: int = 0
                              ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
        """``log p(prompt[t] | prompt[:t])`` under the loaded weights, NaN at position 0 (no context); and
        with ``topk`` the ``[len(prompt), topk]`` most likely ids and their logprobs, empty cells (row 0,
        or past the vocabulary) as the client reads them: id 0 and ``MASK_LOGPROB``."""
        logprobs, top = await self.engine.prompt_logprobs(prompt, topk)
        if top is None:
            return logprobs, None
        ids, lps = top
        empty = ~np.isfinite(lps)
        return logprobs, (np.where(empty, 0, ids).astype(np.int32), np.where(empty, MASK_LOGPROB, lps).astype(np.float32))
