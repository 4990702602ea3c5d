"""The ``hf`` engine: Hugging Face transformers generation on CPU or GPU, batching concurrent requests.

Concurrent ``generate`` calls go to a :class:`~.batcher.ContinuousBatcher`, which decodes them
together on one worker thread: prompts are left-padded and prefilled in one forward (once per
distinct prompt, so the samples of a GRPO group share it), then one forward per step decodes every
unfinished row. A finished request is returned at once; its row leaves the batch and the KV cache
when half the batch has finished or new requests join (see :class:`_Batch`). Requests that arrive
meanwhile are prefilled and join the running batch at the next step (caches are left-padded to a
common length). Each row keeps its own sampling settings and random
generator, so a request with a ``seed`` gives the same tokens whatever it is batched with.
Logprobs are described in :mod:`skyrl_trainers.engines.sampling`.

Weight updates (:meth:`HFEngine.update_weights`) run on the same thread. With
``in_flight_updates="off"`` (the default) they wait until the rows in flight are done (no new rows
are admitted meanwhile), so no completion mixes two versions of the weights. With ``"keep"`` or
``"recompute"`` they land between two decode steps without draining the batch: rows in flight go on
with the new weights, over their KV cache as it is (``keep``: positions before the update hold the
old weights' keys and values, and the next token is still sampled from logits the old weights
computed) or after one forward over prompt + tokens so far with the new weights (``recompute``: the
cache and the next token's logits are the new policy's). ``weight_version`` counts updates;
``GenerateOutput.metadata["weight_version"]`` is the version when the request was admitted and
``GenerateOutput.weight_versions`` the version whose logits each token was sampled from.

On a float32 CPU model the linear layers decode with weights packed for oneDNN
(:class:`PackedLinears`), which roughly halves a decode step; see ``HFEngineConfig.packed_weights``. On a
CPU whose bf16 matmuls run faster than fp32 ones (``skyrl_trainers.precision``) the decoder layers'
copies are bfloat16 (``packed_dtype``): prefill ran about 1.7x faster again on one such CPU, while the
model, its output head and everything between the linear layers stay float32.
"""

from __future__ import annotations

import inspect
import math
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams, StopReason
from transformers.cache_utils import DynamicCache, DynamicLayer

from skyrl_trainers.engines.batcher import ContinuousBatcher, Session
from skyrl_trainers.engines.sampling import LogprobMode, RowParams, sample_next
from skyrl_trainers.engines.weights import copy_named_tensors


class HFEngineConfig(BaseModel):
    """Options of the ``hf`` engine (section ``engine`` of a run config)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field("smollm2-135m", description="Built-in name (tiny-random, smollm2-135m), HF hub id or folder.")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (cuda when available).")
    dtype: str = Field("auto", description="float32, bfloat16, float16, or auto (bfloat16 on CUDA, else float32).")
    max_batch_size: int = Field(64, ge=1, description="Most requests decoded together in one batch.")
    batch_wait_ms: float = Field(5.0, ge=0, description="After a request arrives, wait this long for more to batch.")
    batch_wait_max_ms: float = Field(0.0, ge=0, description="Above batch_wait_ms: each new arrival restarts the "
                                     "wait, up to this long in all (for requests that trickle in, e.g. over HTTP).")
    logprobs_mode: LogprobMode = Field("processed", description="processed: under the sampling distribution "
                                       "(temperature, top-k, top-p); raw: of the unmodified model.")
    seed: int | None = Field(None, description="Seeds requests that bring no seed of their own.")
    packed_weights: bool | None = Field(None, description="Decode with a copy of the linear weights packed for "
                                        "oneDNN (CPU float32 only; one more copy of those weights while it is "
                                        "kept). None: on wherever it applies.")
    packed_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Dtype of the packed copies of the decoder layers' linear weights (the output head "
        "stays float32); bfloat16 casts each layer's input to bf16 and its output back. auto: bfloat16 on a CPU "
        "with bf16 instructions (AVX512-BF16 or AMX) that ran a probe matmul faster in bf16 (as "
        "trainer.precision: auto decides), else float32. Training runs set it from trainer.precision.")
    in_flight_updates: Literal["off", "keep", "recompute"] = Field(
        "off", description="What a weight update does to rows decoding: off: waits until they finish; "
        "keep: lands between two decode steps, rows keep their KV cache and go on with the new weights; "
        "recompute: as keep, but rows are re-prefilled with the new weights.")
    replicas: int = Field(1, ge=1, description="Copies of the engine, each in its own Ray actor (with its own GPU "
                          "on CUDA), behind one client that routes requests by load and keeps a session (an episode) "
                          "on one replica; weight updates reach all of them. >1 needs trainer.engine_placement=ray.")


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    row: RowParams
    max_new_tokens: int
    stop_ids: frozenset[int]
    weight_version: int = 0  # at admission
    logits_version: int = 0  # of the weights that computed the row's pending next-token logits
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)  # of each sampled token
    stop_reason: StopReason | None = None


@dataclass
class _Batch:
    """Rows being decoded together: their KV cache, the logits of their next token, mask and positions.

    A finished row stays in the batch (its outputs ignored) until at least half the rows have finished
    or new rows join: removing a row copies every layer's keys and values of all the others, which
    cost a fifth of a decode when rows left one at a time, while decoding a few idle rows costs little.
    """

    rows: list[_Request]
    cache: Any
    logits: torch.Tensor
    attention_mask: torch.Tensor
    next_position: torch.Tensor
    finished: set[int] = field(default_factory=set)  # indices of delivered rows still in the batch

    @property
    def live_rows(self) -> int:
        return len(self.rows) - len(self.finished)

    def compact(self, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Drop the finished rows once they are half the batch; ``tokens`` (one per row) for the rows kept."""
        if 2 * len(self.finished) < len(self.rows):
            return tokens
        keep = self._select_live(device)
        return tokens[keep]

    def select_live(self, device: torch.device) -> None:
        """Drop the finished rows now (before new rows join, or a re-prefill)."""
        if self.finished:
            self._select_live(device)

    def _live(self) -> list[int]:
        """Indices of the rows not yet delivered."""
        return [i for i in range(len(self.rows)) if i not in self.finished]

    def _select_live(self, device: torch.device) -> torch.Tensor:
        keep = torch.tensor(self._live(), dtype=torch.long, device=device)
        if len(keep):
            self.cache.batch_select_indices(keep)
        self.rows = [self.rows[i] for i in keep.tolist()]
        self.logits, self.attention_mask, self.next_position = (
            self.logits[keep], self.attention_mask[keep], self.next_position[keep])
        self.finished = set()
        return keep

    def mergeable(self) -> bool:
        """New rows can join only caches made of plain growing layers (not sliding-window or static ones)."""
        return _plain_layers(self.cache)

    def merge(self, other: _Batch) -> _Batch:
        """This batch's live rows and ``other``'s as one batch, in one copy of the keys and values: finished
        rows are left out, then the padding that every remaining row has on its left (the finished rows may
        have been the longest), and the shorter cache and mask are left-padded to the longer one's length."""
        live = self._live()
        keep = torch.tensor(live, dtype=torch.long, device=self.attention_mask.device) if self.finished else None
        mask = self.attention_mask if keep is None else self.attention_mask[keep]
        lead = int(mask.argmax(-1).min())  # columns before every live row's first real position

        def mine(states: torch.Tensor) -> torch.Tensor:
            return (states if keep is None else states[keep])[:, :, lead:]

        mask = mask[:, lead:]
        width = max(mask.shape[1], other.attention_mask.shape[1])
        rows = [self.rows[i] for i in live]
        room = _room_for(rows + other.rows)
        for k, (layer, theirs) in enumerate(zip(self.cache.layers, other.cache.layers, strict=True)):
            self.cache.layers[k] = _RoomyLayer.stacked([mine(layer.keys), theirs.keys],
                                                       [mine(layer.values), theirs.values], width, room)
        mask = torch.cat([_pad_left(mask, width, 1), _pad_left(other.attention_mask, width, 1)])
        logits, positions = (self.logits, self.next_position) if keep is None else (
            self.logits[keep], self.next_position[keep])
        return _Batch(rows + other.rows, self.cache, torch.cat([logits, other.logits]), mask,
                      torch.cat([positions, other.next_position]))


class HFEngine:
    """A transformers causal LM behind skyrl-core's ``InferenceEngine`` protocol. Safe to call concurrently."""

    def __init__(self, config: HFEngineConfig | None = None) -> None:
        from skyrl_trainers.models import ModelLoadError, load_model_and_tokenizer

        config = config or HFEngineConfig()
        device = resolve_device(config.device)
        try:
            model, tokenizer = load_model_and_tokenizer(config.model, dtype=config.dtype, device=device)
        except ModelLoadError as exc:
            raise EngineError(f"hf engine: {exc}") from exc
        self._setup(model, tokenizer, config)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, config: HFEngineConfig | None = None) -> HFEngine:
        """Wrap an in-memory model (used as is, not copied; ``config.model``/``device``/``dtype`` are ignored).

        For colocated training pass a copy of the policy and sync it with :meth:`update_weights`.
        """
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, config or HFEngineConfig())
        return engine

    def _setup(self, model: torch.nn.Module, tokenizer: Any, config: HFEngineConfig) -> None:
        self.config = config
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)
        self.eos_ids = frozenset(_eos_ids(model, tokenizer))
        # transformers 5 renamed the KV-cache argument ``past_key_values`` to ``cache``.
        self.cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.weight_version = 0
        self.sampling_steps = 0  # steps that sampled a token for every row (for tests: "decoding by now")
        self.joins = 0  # times arrivals joined a running batch (for tests and benchmarks)
        self.packed = PackedLinears(model, enabled=config.packed_weights, dtype=config.packed_dtype)
        self.prefixes = PrefixCache(model, enabled=config.in_flight_updates == "off", capacity=config.max_batch_size)
        self._seeds = random.Random(config.seed)
        self._batcher: ContinuousBatcher[_Request, GenerateOutput] = ContinuousBatcher(
            self._decode, max_batch_size=config.max_batch_size, wait_s=config.batch_wait_ms / 1000,
            max_wait_s=config.batch_wait_max_ms / 1000, name="hf-engine")

    @property
    def in_flight_updates(self) -> str:
        """``off``, ``keep`` or ``recompute`` (``HFEngineConfig.in_flight_updates``)."""
        return self.config.in_flight_updates

    @property
    def batch_sizes(self) -> list[int]:
        """Requests each decode started with (for tests and benchmarks)."""
        return self._batcher.batch_sizes

    @property
    def joined(self) -> int:
        """Requests that joined a batch already decoding."""
        return self._batcher.joined

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        return await self._batcher.submit(self._request(prompt_ids, params))

    async def prompt_logprobs(self, prompt_ids: list[int], topk: int = 0
                              ) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
        """``log p(prompt[t] | prompt[:t])`` of the model as is (raw, whatever ``logprobs_mode``), NaN at
        ``t = 0``; with ``topk`` also the ``[len(prompt), topk]`` most likely ids (int64) and their
        logprobs (float32), best first, row 0 (and columns past the vocabulary) padded with id 0 and ``-inf``.

        One forward on the decode thread, between two decode steps (ordered with weight updates, without
        waiting for the rows in flight).
        """
        prompt = self._check_prompt(prompt_ids)
        return await self._batcher.run_between_steps(self._score_prompt, prompt, topk)

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Copy new weights into the model in place (see ``copy_named_tensors``): once the rows in flight
        are done, or between two decode steps with ``in_flight_updates`` keep/recompute."""
        if self.config.in_flight_updates == "off":
            await self._batcher.run_exclusive(self._copy_weights, named_tensors)
        else:
            await self._batcher.run_between_steps(self._copy_weights, named_tensors)

    async def release_memory(self) -> None:
        """Drop what the engine keeps between batches (packed weights, cached prefixes) once the rows in flight are done.

        Trainers call it when a rollout ends, so that the update has that memory; the next batch repacks.
        """
        await self._batcher.run_exclusive(self._release)

    def _release(self) -> None:
        self.packed.drop()
        self.prefixes.clear()

    def close(self) -> None:
        self._batcher.close()

    def _copy_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        self.packed.drop()  # stale from here on (a shared engine's weights changed in place already)
        self.prefixes.clear()
        try:
            copy_named_tensors(self.model, named_tensors)
            self.weight_version += 1
        finally:
            self.packed.refresh()  # mid-decode (an in-flight update): repack now, before the next step

    def _check_prompt(self, prompt_ids: list[int]) -> list[int]:
        if not prompt_ids:
            raise EngineError("hf engine: prompt_ids is empty")
        vocab = self.model.get_input_embeddings().num_embeddings
        bad = [i for i in prompt_ids if not 0 <= int(i) < vocab]
        if bad:
            raise EngineError(f"hf engine: prompt has token ids outside the vocabulary (size {vocab}): {bad[:5]}")
        return [int(i) for i in prompt_ids]

    @torch.inference_mode()
    def _score_prompt(self, prompt: list[int], topk: int) -> tuple[list[float], tuple[np.ndarray, np.ndarray] | None]:
        ids = torch.tensor([prompt], device=self.device)
        log_probs = torch.log_softmax(self.model(input_ids=ids, use_cache=False).logits[0, :-1].float(), dim=-1)
        logp = log_probs.gather(-1, ids[0, 1:, None]).squeeze(-1)
        top = None
        if topk:
            values, indices = log_probs.topk(min(topk, log_probs.shape[-1]), dim=-1)
            top_ids = np.zeros((len(prompt), topk), np.int64)
            top_lps = np.full((len(prompt), topk), -np.inf, np.float32)
            top_ids[1:, :indices.shape[1]] = indices.cpu().numpy()
            top_lps[1:, :values.shape[1]] = values.cpu().numpy()
            top = (top_ids, top_lps)
        return [math.nan, *logp.tolist()], top

    def _request(self, prompt_ids: list[int], params: SamplingParams) -> _Request:
        prompt_ids = self._check_prompt(prompt_ids)
        room = params.max_tokens
        if self.max_context is not None:
            room = min(room, self.max_context - len(prompt_ids))
            if room < 1:
                raise EngineError(f"hf engine: prompt has {len(prompt_ids)} tokens, the model's context is "
                                  f"{self.max_context}; no room to generate")
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        row = RowParams(params.temperature, params.top_k, params.top_p, generator)
        eos_ids = frozenset() if params.ignore_eos else self.eos_ids
        return _Request(prompt_ids, params, row, room, eos_ids | set(params.stop_token_ids))

    @torch.inference_mode()
    def _decode(self, requests: list[_Request], session: Session[_Request, GenerateOutput]) -> None:
        """Decode until every request is delivered, admitting new arrivals between steps."""
        with self.packed:
            self._decode_rows(requests, session)

    def _decode_rows(self, requests: list[_Request], session: Session[_Request, GenerateOutput]) -> None:
        session.between_steps()
        batch = self._prefill(requests)
        while batch.rows and not session.closed:
            version = self.weight_version
            if session.between_steps() and self.weight_version != version and \
                    self.config.in_flight_updates == "recompute":
                batch = self._recompute(batch)
            tokens, logprobs = sample_next(batch.logits, [r.row for r in batch.rows], self.config.logprobs_mode)
            self.sampling_steps += 1
            for i, (request, token, logprob) in enumerate(
                    zip(batch.rows, tokens.tolist(), logprobs.tolist(), strict=True)):
                if i in batch.finished:
                    continue
                if self._append(request, token, logprob) or self._abandoned(request, session):
                    self.prefixes.remember(request, batch, i)
                    session.deliver(request, self._output(request))
                    batch.finished.add(i)
            tokens = batch.compact(tokens, self.device)
            if batch.rows:
                batch = self._step(batch, tokens)
            room = self.config.max_batch_size - batch.live_rows
            if batch.rows and room > 0 and batch.mergeable():
                arrived = session.take(room)
                if arrived:
                    batch = batch.merge(self._prefill(arrived))
                    self.joins += 1

    def _prefill(self, requests: list[_Request]) -> _Batch:
        """One forward over the prompts; requests with the same prompt (a GRPO group) share its row, and
        a request that continues a finished one (an episode's next turn) runs only its new tokens."""
        for request in requests:
            request.weight_version = self.weight_version
        found = [self.prefixes.take(r.prompt_ids) for r in requests]
        fresh = [r for r, prefix in zip(requests, found, strict=True) if prefix is None]
        continued = [(r, prefix) for r, prefix in zip(requests, found, strict=True) if prefix is not None]
        batches = []
        if fresh:
            batches.append(self._forward_contexts(fresh, [r.prompt_ids for r in fresh]))
        if continued:
            batches.append(self._continue(continued))
        return batches[0] if len(batches) == 1 else batches[0].merge(batches[1])

    def _continue(self, continued: list[tuple[_Request, _Prefix]]) -> _Batch:
        """One forward over the tokens each prompt adds to its prefix, on top of the prefix's keys and values.

        Row ``i`` of the cache is ``[padding | prefix i | padding | new tokens of i]``: both parts are
        left-padded to their longest, and the mask and position ids skip the padding in the middle.
        """
        requests = [r for r, _ in continued]
        for request in requests:
            request.logits_version = self.weight_version
        past = max(p.length for _, p in continued)
        input_ids, new_mask = _left_pad([r.prompt_ids[p.length:] for r, p in continued], self.pad_id, self.device)
        # the buffers hold the new tokens too (this forward appends them in place) and the rows' decode
        room = input_ids.shape[1] + _room_for(requests)
        cache = DynamicCache()
        for _ in range(len(continued[0][1].layers)):
            parts = [p.layers.pop(0) for _, p in continued]  # taken out, so each layer's copies go once stacked
            cache.layers.append(_RoomyLayer.stacked([k for k, _ in parts], [v for _, v in parts], past, room))
        lengths = torch.tensor([p.length for _, p in continued], device=self.device)
        past_mask = (torch.arange(past, device=self.device) >= past - lengths[:, None]).long()
        positions = lengths[:, None] + new_mask.cumsum(-1) - 1
        mask = torch.cat([past_mask, new_mask], dim=1)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_kwarg: cache})
        return _Batch(requests, _cache_of(out), out.logits[:, -1, :], mask, positions[:, -1] + 1)

    def _recompute(self, batch: _Batch) -> _Batch:
        """The rows re-prefilled (prompt + tokens so far) with the current weights: a new cache and logits."""
        batch.select_live(self.device)
        batch.cache = None  # the old cache goes before the new one is built
        return self._forward_contexts(batch.rows, [r.prompt_ids + r.token_ids for r in batch.rows])

    def _forward_contexts(self, requests: list[_Request], contexts: list[list[int]]) -> _Batch:
        """One forward over ``contexts`` (one per request; equal ones share a row): their cache and logits."""
        for request in requests:
            request.logits_version = self.weight_version
        unique: dict[tuple[int, ...], int] = {}
        row_of = [unique.setdefault(tuple(c), len(unique)) for c in contexts]
        input_ids, attention_mask = _left_pad([list(p) for p in unique], self.pad_id, self.device)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        cache, logits, next_position = _cache_of(out), out.logits[:, -1, :], positions[:, -1] + 1
        index = torch.tensor(row_of, device=self.device)
        logits, attention_mask, next_position = logits[index], attention_mask[index], next_position[index]
        if _plain_layers(cache):  # one layer at a time, into buffers with room for the rows' whole decode
            width, room = attention_mask.shape[1], _room_for(requests)
            for k, layer in enumerate(cache.layers):
                cache.layers[k] = _RoomyLayer.stacked([layer.keys[index]], [layer.values[index]], width, room)
        else:
            cache.batch_select_indices(index)
        return _Batch(list(requests), cache, logits, attention_mask, next_position)

    def _step(self, batch: _Batch, tokens: torch.Tensor) -> _Batch:
        for request in batch.rows:
            request.logits_version = self.weight_version
        mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones(len(batch.rows), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=batch.next_position[:, None],
                         use_cache=True, **{self.cache_kwarg: batch.cache})
        return _Batch(batch.rows, _cache_of(out), out.logits[:, -1, :], mask, batch.next_position + 1,
                      batch.finished)

    def _append(self, request: _Request, token: int, logprob: float) -> bool:
        """Record one sampled token; True when the request is finished."""
        request.token_ids.append(token)
        request.logprobs.append(logprob)
        request.weight_versions.append(request.logits_version)
        if token in request.stop_ids or self._hits_stop_string(request):
            request.stop_reason = "stop"
        elif len(request.token_ids) >= request.max_new_tokens:
            request.stop_reason = "length"
        return request.stop_reason is not None

    @staticmethod
    def _abandoned(request: _Request, session: Session[_Request, GenerateOutput]) -> bool:
        """The caller cancelled its ``generate``: the row leaves the batch (``abort``) instead of decoding on."""
        if not session.abandoned(request):
            return False
        request.stop_reason = "abort"
        return True

    def _hits_stop_string(self, request: _Request) -> bool:
        if not request.params.stop:
            return False
        # Only the tail can contain a stop string that the newest token completed.
        longest = max(len(s) for s in request.params.stop)
        tail = self.tokenizer.decode(request.token_ids[-(longest + 1):], skip_special_tokens=False)
        return any(stop in tail for stop in request.params.stop)

    def _output(self, request: _Request) -> GenerateOutput:
        assert request.stop_reason is not None
        text = self.tokenizer.decode(request.token_ids, skip_special_tokens=False)
        return GenerateOutput(request.token_ids, request.logprobs, request.stop_reason, text,
                              metadata={"weight_version": request.weight_version},
                              weight_versions=list(request.weight_versions))


@dataclass
class _Prefix:
    """The keys and values of a finished row: its prompt and every token but the last (never fed)."""

    length: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, heads, length, head_dim]
    bytes: int  # of all those keys and values


class PrefixCache:
    """Finished rows' keys and values, for the requests that continue them.

    A multi-turn episode's next prompt is its last prompt, the tokens just generated, then the
    environment's observation: with the finished row's keys and values at hand, the engine prefills
    only the observation (in the main job, a turn-2 prompt of about 280 tokens shrinks to about 90).
    A request takes the longest cached prefix of its prompt, which leaves the cache. Entries are
    dropped when the weights change (an update, or the model's tensors changed in place) and when the
    engine releases its memory; at most ``capacity`` entries and ``max_bytes`` of keys and values are
    kept (long prompts from a server's clients cannot pile up), the oldest going first. Only when
    updates never land mid-decode (``in_flight_updates="off"``): otherwise a row's keys and values can
    mix two versions of the weights.
    """

    def __init__(self, model: torch.nn.Module, enabled: bool, capacity: int, max_bytes: int = 512 * 2**20) -> None:
        self.model, self.enabled, self.capacity, self.max_bytes = model, enabled, capacity, max_bytes
        self.entries: OrderedDict[tuple[int, ...], _Prefix] = OrderedDict()
        self.bytes = 0
        self._stamp: list[tuple[int, int]] = []
        self.hits = 0  # prompts that continued a cached prefix (for tests and benchmarks)

    def remember(self, request: _Request, batch: _Batch, row: int) -> None:
        if not self.enabled or request.stop_reason == "abort" or not batch.mergeable():
            return
        length = len(request.prompt_ids) + len(request.token_ids) - 1
        positions = batch.attention_mask[row].nonzero().squeeze(1)
        if len(positions) != length:
            return
        layers = [(layer.keys[row:row + 1, :, positions], layer.values[row:row + 1, :, positions])
                  for layer in batch.cache.layers]
        size = sum(t.numel() * t.element_size() for pair in layers for t in pair)
        if size > self.max_bytes:
            return
        self._check_stamp()
        key = tuple(request.prompt_ids + request.token_ids[:-1])
        if key in self.entries:
            self._drop(key)
        self.entries[key] = _Prefix(length, layers, size)
        self.bytes += size
        while len(self.entries) > self.capacity or self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def take(self, prompt: list[int]) -> _Prefix | None:
        """The longest cached prefix of ``prompt`` that leaves at least one token to run, removed from the cache."""
        if not self.entries:
            return None
        self._check_stamp()
        best = max((key for key in self.entries if len(key) < len(prompt) and tuple(prompt[:len(key)]) == key),
                   key=len, default=None)
        if best is None:
            return None
        self.hits += 1
        return self._drop(best)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def _drop(self, key: tuple[int, ...]) -> _Prefix:
        prefix = self.entries.pop(key)
        self.bytes -= prefix.bytes
        return prefix

    def _check_stamp(self) -> None:
        stamp = [(p.data_ptr(), p._version) for p in self.model.parameters()]
        if stamp != self._stamp:
            self.clear()
            self._stamp = stamp


class PackedLinears:
    """Runs a CPU model's ``nn.Linear`` layers on copies of their weights packed for oneDNN, while decoding.

    At decode batch sizes (a few dozen rows) a plain float32 ``linear`` re-packs its weight on every
    call and reaches about half the machine's matmul rate; weights reordered once into oneDNN's blocked
    layout run near the full rate (one decode step of SmolLM2-135M at 32 rows: 123 ms plain, 59 ms
    packed; logits equal within 2e-4). The price is one more copy of the linear weights while they are
    kept, so :meth:`drop` frees them (on every weight update, and from :meth:`HFEngine.release_memory`)
    and the next batch repacks (about 0.15 s for that model); weights changed in place without an
    update (their version counters moved) are repacked as well. The packed forwards are installed only
    inside ``with packed:`` (the engine's decode), as instance attributes, so the module seen by anyone
    else (a copy, a state dict, a backward pass) is the plain one. An update that lands inside a decode
    (``in_flight_updates``) calls :meth:`drop`, which also takes the stale forwards out, then
    :meth:`refresh`, which repacks the new weights and puts the packed forwards back before the next step.
    """

    def __init__(self, model: torch.nn.Module, enabled: bool | None = None, dtype: str = "float32") -> None:
        self.layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        usable = bool(self.layers) and packing_available() and all(
            layer.weight.device.type == "cpu" and layer.weight.dtype == torch.float32 for layer in self.layers)
        if enabled and not usable:
            raise EngineError("hf engine: packed_weights=true needs a float32 model on CPU and a torch built "
                              "with oneDNN (torch.backends.mkldnn)")
        self.enabled = usable if enabled is None else enabled
        packed = resolve_packed_dtype(dtype) if self.enabled else torch.float32
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        # the head stays float32: the trainer takes its logits in float32 too, and bf16 logits would round
        # every logprob by up to 0.06 at typical magnitudes
        self.dtypes = [torch.float32 if layer is head else packed for layer in self.layers]
        self.weights: list[torch.Tensor] | None = None
        self.active = False  # inside ``with packed:``
        self._stamp: list[tuple[int, int]] = []

    def _current_stamp(self) -> list[tuple[int, int]]:
        """Each weight's storage and in-place version counter: any change means the packed copy is stale."""
        return [(layer.weight.data_ptr(), layer.weight._version) for layer in self.layers]

    def __enter__(self) -> PackedLinears:
        self.active = True
        self._install()
        return self

    def _install(self) -> None:
        if not self.enabled:
            return
        if self.weights is None or self._stamp != self._current_stamp():  # repack weights changed in place
            self._stamp = self._current_stamp()
            with torch.no_grad():
                self.weights = [torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach().to(dtype), None)
                                for layer, dtype in zip(self.layers, self.dtypes, strict=True)]
        for layer, weight in zip(self.layers, self.weights, strict=True):
            layer.forward = _packed_forward(weight, layer.bias)

    def _uninstall(self) -> None:
        for layer in self.layers:
            layer.__dict__.pop("forward", None)

    def __exit__(self, *exc: object) -> None:
        self.active = False
        self._uninstall()

    def drop(self) -> None:
        """Free the packed copies (stale after a weight update); the next ``with`` (or :meth:`refresh`)
        repacks. Inside a ``with`` the layers go back to their plain forwards meanwhile."""
        self.weights = None
        self._uninstall()

    def refresh(self) -> None:
        """Inside a ``with``: repack weights that changed (or were dropped) and reinstall the packed
        forwards, so the next forward uses the current weights. Outside one: nothing."""
        if self.active:
            self._install()


def packing_available() -> bool:
    """Whether this torch can run linear layers on oneDNN-packed weights."""
    ops = getattr(torch.ops, "mkldnn", None)
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


def resolve_packed_dtype(dtype: str) -> torch.dtype:
    """``HFEngineConfig.packed_dtype`` as a torch dtype (``auto``: bfloat16 where this CPU runs it faster,
    the same choice as ``trainer.precision: auto``)."""
    from skyrl_trainers.precision import cpu_auto_precision

    if dtype == "auto":
        dtype = "bfloat16" if cpu_auto_precision().bf16 else "float32"
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if dtype == "bfloat16" and not (supported and supported()):
        raise EngineError("hf engine: packed_dtype=bfloat16 needs a CPU with bf16 support in oneDNN (AVX512 or "
                          "newer); use packed_dtype=float32")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def _packed_forward(weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    if weight.dtype == torch.float32:
        def forward(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return forward

    def forward_low(x: torch.Tensor) -> torch.Tensor:
        # the bias (float32, the model's own tensor) is added after the cast back, so it never goes stale
        out = torch.ops.mkldnn._linear_pointwise(x.to(weight.dtype), weight, None, "none", [], "").to(x.dtype)
        return out if bias is None else out + bias
    return forward_low


class _RoomyLayer(DynamicLayer):
    """A :class:`DynamicLayer` whose keys and values are the front of buffers with room to grow.

    A decode step writes its new key and value in place instead of copying the whole layer with
    ``torch.cat`` (which a plain ``DynamicLayer`` does every step). Anything that replaces ``keys``
    or ``values`` (cropping, say) just makes the next ``update`` move them to new buffers.
    """

    room = 64  # spare positions allocated when an update finds the buffers full
    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None

    @classmethod
    def stacked(cls, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], width: int, room: int
                ) -> _RoomyLayer:
        """A layer of ``keys``/``values`` (``[rows, heads, length, head_dim]`` parts) stacked along the batch,
        each left-padded with zeros to ``width``, in buffers with ``room`` spare positions.

        Each part is copied once, and the decode steps that follow append in place: building the same
        with ``torch.cat`` and a ``DynamicLayer`` copies every key and value two or three times over.
        """
        layer = cls()
        layer.lazy_initialization(keys[0], values[0])
        layer._key_buffer, layer._value_buffer = _stack_left_padded(keys, width, room), _stack_left_padded(
            values, width, room)
        layer.keys, layer.values = layer._key_buffer[:, :, :width], layer._value_buffer[:, :, :width]
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        length, end = self.keys.shape[-2], self.keys.shape[-2] + key_states.shape[-2]
        if not (_front_of(self.keys, self._key_buffer, end) and _front_of(self.values, self._value_buffer, end)):
            self._key_buffer = _with_room(self.keys, end + self.room)
            self._value_buffer = _with_room(self.values, end + self.room)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, length:end] = key_states
        self._value_buffer[:, :, length:end] = value_states
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Only the rows at ``indices``, in buffers with the same room (one copy of the positions in use)."""
        length = self.get_seq_length()
        if length and _front_of(self.keys, self._key_buffer, length) and _front_of(
                self.values, self._value_buffer, length):
            assert self._key_buffer is not None
            room = self._key_buffer.shape[2] - length
            self._key_buffer = _stack_left_padded([self.keys[indices]], length, room)
            self._value_buffer = _stack_left_padded([self.values[indices]], length, room)
            self.keys, self.values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]
        else:
            super().batch_select_indices(indices)


def _front_of(tensor: torch.Tensor, buffer: torch.Tensor | None, end: int) -> bool:
    """Whether ``tensor`` is ``buffer[:, :, :n]`` for some n, and the buffer holds ``end`` positions."""
    return (buffer is not None and end <= buffer.shape[2] and tensor.data_ptr() == buffer.data_ptr()
            and tensor.shape[:2] == buffer.shape[:2] and tensor.shape[3:] == buffer.shape[3:]
            and tensor.stride() == buffer.stride() and tensor.dtype == buffer.dtype)


def _stack_left_padded(parts: Sequence[torch.Tensor], width: int, room: int) -> torch.Tensor:
    """``parts`` stacked along dim 0, each left-padded with zeros to ``width`` along dim 2, in a buffer of
    ``width + room`` positions (the room is left uninitialised)."""
    first = parts[0]
    buffer = first.new_empty((sum(p.shape[0] for p in parts), first.shape[1], width + room, *first.shape[3:]))
    row = 0
    for part in parts:
        rows, pad = part.shape[0], width - part.shape[2]
        buffer[row:row + rows, :, :pad].zero_()
        buffer[row:row + rows, :, pad:width] = part
        row += rows
    return buffer


def _room_for(requests: Sequence[_Request], most: int = 256) -> int:
    """Spare positions for a batch of ``requests``: its longest remaining decode, at least one and at most
    ``most`` (on a GPU the room is allocated at once; past it the buffers grow by ``_RoomyLayer.room``)."""
    return min(most, max(1, max(r.max_new_tokens - len(r.token_ids) for r in requests)))


def _plain_layers(cache: Any) -> bool:
    """Whether ``cache`` is made of plain growing layers only (not sliding-window or static ones)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, _RoomyLayer) for layer in layers)


def _with_room(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    """``tensor`` at the front of a new buffer of ``capacity`` positions (an update that found no room)."""
    return _stack_left_padded([tensor], tensor.shape[2], capacity - tensor.shape[2])


def resolve_device(device: str) -> str:
    """``auto`` becomes ``cuda`` when a CUDA device is visible, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"hf engine: device {device!r} requested but torch sees no CUDA device; use device=cpu")
    return device


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return ids


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zeros prepended along ``dim`` up to ``width`` (zeros in a mask mean "do not attend")."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _left_pad(rows: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids.to(device), mask.to(device)
