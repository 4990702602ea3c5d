"""What each Tinker request does: ownership and validation, then work queued on the training worker or
the sampler.

HTTP-free (``skyrl_tinker.routes`` maps routes onto these methods): every method either returns a JSON-ready
dict, returns a :class:`~skyrl_tinker.futures.Future` for queued work, or raises
:class:`RequestError` with an HTTP status and a message naming what was wrong.

Tenants (:mod:`skyrl_tinker.tenants`): every method takes the tenant the request comes from.
Sessions, models, sampling sessions and futures record their tenant, runs record it in ``run.json``,
and an object of another tenant is answered exactly as an unknown id is (404), whatever the request
does with it. The one exception is a checkpoint its owner published: any tenant may load it, sample
it and read its ``weights_info`` (never list its run, delete or publish it). Ids are random (128
bits). A tenant past one of its :class:`~skyrl_tinker.tenants.Limits` gets a 429 naming the limit.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from pydantic import ValidationError
from skyrl_core.engine import SamplingParams
from skyrl_core.http_hygiene import shown, validation_detail

from skyrl_tinker.backend import ADAM_DEFAULTS, AdapterSpec, Backend
from skyrl_tinker.checkpoints import CheckpointError, CheckpointStore, TinkerPath, new_run_id
from skyrl_tinker.fields import FLOAT32_MAX, INT64_MAX, FieldError, Fields, integers
from skyrl_tinker.futures import Future, FutureStore, Result
from skyrl_tinker.losses import LossInputError
from skyrl_tinker.sampler import SampleJob, Sampler, SamplerWeights
from skyrl_tinker.seeds import ServerSeeds
from skyrl_tinker.sessions import Session, SessionRegistry
from skyrl_tinker.tenants import Limits
from skyrl_tinker.wire import ForwardBackwardIn
from skyrl_tinker.worker import Job, TrainWorker

log = logging.getLogger(__name__)

MAX_NUM_SAMPLES = 128
MAX_LORA_RANK = 256
DEFAULT_MAX_TOKENS = 256
FUTURE_TTL = 3600.0  # seconds a finished result stays retrievable
MAX_TOPK = 64
# Each is checked at every decoding step of every row of a sample: a million of them would stall the sampler,
# which every tenant shares (vLLM sets no limit; OpenAI's API allows 4)
MAX_STOP_SEQUENCES, MAX_STOP_CHARS = 64, 1000
CLONE_SEQ_IDS = 1_000_000_000  # the client numbers a cloned SamplingClient's requests from clone * 1e9
MAX_CLONES = 1024  # clones of one sampling session, each with its own completion log on the server
MAX_RETRIEVED_IDS = 4096  # ids one retrieve_futures call acknowledges (the client's are at most those it sent)
MAX_TEMPERATURE = 100.0  # far past any useful sampling temperature (the distribution is uniform long before)
# (lo, hi) of each AdamParams field: a step size over 1, or an eps over 1, is no optimizer setting anyone means
ADAM_BOUNDS = {"learning_rate": (0.0, 1.0), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0), "eps": (0.0, 1.0),
               "weight_decay": (0.0, 1e4), "grad_clip_norm": (0.0, FLOAT32_MAX)}
UNSUPPORTED_SAMPLE_FIELDS = {"topk_sample_logprobs": "top-k sample logprobs",
                             "target_prompt_logprobs": "target prompt logprobs",
                             "prompt_alt_tokens_k": "prompt alternative tokens"}
# The client retries a 429 with backoff (for up to five minutes): a full queue drains, so let it; a
# tenant's sessions or models stay until it lets go of some, so tell it not to.
_RETRY_SOON = {"retry-after": "1"}
_DO_NOT_RETRY = {"x-should-retry": "false"}


class RequestError(Exception):
    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass
class ModelInfo:
    model_id: str
    run_id: str  # where its checkpoints go: the model id itself, except for a model created by a load
    tenant: str
    session_id: str
    spec: AdapterSpec
    sampler_seq: int = 0


@dataclass
class SamplingSession:
    sampling_session_id: str
    tenant: str
    session_id: str
    weights: SamplerWeights
    model_path: str | None
    last_used: int = 0  # a tick of the service's clock: when it was opened or last sampled
    samples: list[Future] = field(default_factory=list)  # its samples still in the future store (at the last look)

    def busy(self, futures: FutureStore) -> bool:
        """Whether a sample of it is queued, running, or done but not yet collected: the client acknowledges
        what it fetched (``retrieve_futures``), which drops the future. Closing it would fail its poll."""
        self.samples = [f for f in self.samples if futures.get(f.request_id) is f]
        return bool(self.samples)


class TinkerService:
    def __init__(self, backend: Backend, sampler: Sampler, checkpoints: CheckpointStore,
                 sessions: SessionRegistry, futures: FutureStore, limits: Limits | None = None,
                 seeds: ServerSeeds | None = None) -> None:
        self.backend = backend
        self.seeds = seeds
        self.sampler = sampler
        self.checkpoints = checkpoints
        self.sessions = sessions
        self.futures = futures
        self.limits = limits or Limits()
        self.worker = TrainWorker(backend, futures)
        self.models: dict[str, ModelInfo] = {}
        self.sampling: dict[str, SamplingSession] = {}
        self._sampling_lock = threading.Lock()  # opened by routes and the training worker, closed by both
        self._ticks = itertools.count(1)
        self.base_weights = SamplerWeights("base", {})
        # a checkpoint's weights by key, loaded once for every sampling session and sample that uses them,
        # dropped with the last one
        self.loaded_weights: weakref.WeakValueDictionary[str, SamplerWeights] = weakref.WeakValueDictionary()

    def start(self) -> None:
        self.worker.start()
        self.sampler.start()

    def stop(self) -> None:
        self.worker.stop()
        self.sampler.stop()

    # --- service ---------------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": self.backend.base_model_name,
                                      "max_context_length": self.backend.max_context,
                                      "trainable": True, "sampleable": True}]}

    def _check_base(self, base_model: str | None) -> None:
        if base_model not in (None, self.backend.base_model_name, self.backend.tokenizer_source):
            raise RequestError(400, f"base model {shown(base_model)} is not served here; this server serves "
                                    f"{self.backend.base_model_name!r} (skyrl-tinker serve --base-model)")

    # --- what a tenant owns, and how much ----------------------------------------------------------

    def _session(self, tenant: str, session_id: str) -> Session:
        return _owned(self.sessions.get(session_id), tenant, f"unknown or expired session {shown(session_id)} "
                                                                "(sessions end when heartbeats stop)")

    def _model(self, tenant: str, model_id: str) -> ModelInfo:
        return _owned(self.models.get(model_id), tenant,
                      f"unknown model id {shown(model_id)}; create it with create_model or load_weights")

    def _sampling(self, tenant: str, sampling_id: str) -> SamplingSession:
        return _owned(self.sampling.get(sampling_id), tenant,
                      f"unknown sampling session {shown(sampling_id)} (sampling sessions end with their session, "
                      "and a tenant's least recently used idle one is closed when it opens more than "
                      "--max-sampling-sessions)")

    def future(self, tenant: str, request_id: str) -> Future:
        return _owned(self.futures.get(request_id), tenant,
                      f"unknown request id {shown(request_id)} (never issued, or its session was reaped)")

    def _run_info(self, run_id: str) -> dict[str, Any]:
        try:
            return self.checkpoints.read_run(run_id)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def _own_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        run = self._run_info(run_id)
        if run["owner"] != tenant:
            raise RequestError(404, f"unknown training run {shown(run_id)}")
        return run

    def _readable(self, tenant: str, path: TinkerPath) -> dict[str, Any]:
        """The run of a checkpoint ``tenant`` may load: its own, or one its owner published."""
        run = self._run_info(path.run_id)
        if run["owner"] != tenant and not self.checkpoints.is_public(path):
            raise RequestError(404, f"unknown training run {shown(path.run_id)}")
        return run

    def _new_future(self, tenant: str, kind: str, session_id: str | None, target: tuple[str, int] | None = None
                    ) -> Future:
        _check_limit(tenant, self.futures.pending(tenant), self.limits.queued, "requests queued or running",
                     "--max-queued-requests", "wait for results before sending more", _RETRY_SOON)
        return self.futures.create(kind, tenant, session_id, target)

    def _queue(self, info: ModelInfo, kind: str, run: Callable[[Backend], Result]) -> Future:
        future = self._new_future(info.tenant, kind, info.session_id)
        self.worker.submit(Job(future, info.model_id, run=run))
        return future

    # --- sessions --------------------------------------------------------------------------------

    def create_session(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _check_limit(tenant, self.sessions.count(tenant), self.limits.sessions, "open sessions", "--max-sessions",
                     "close the ServiceClients you are done with (close()); silent ones are reaped after "
                     "--session-timeout", _DO_NOT_RETRY)
        session = self.sessions.create(tenant, Fields(body).text("sdk_version", ""))
        return {"type": "create_session", "session_id": session.session_id}

    def heartbeat(self, tenant: str, body: Mapping[str, Any]) -> None:
        """410 for an unknown, finished, expired or foreign session alike (the client then stops its
        heartbeats)."""
        session_id = Fields(body).text("session_id")
        session = self.sessions.get(session_id)
        if session is None or session.tenant != tenant or not self.sessions.touch(session_id):
            raise RequestError(410, f"session {shown(session_id)} is unknown, finished or expired")

    def finish_session(self, tenant: str, session_id: str) -> None:
        self._session(tenant, session_id)
        session = self.sessions.finish(session_id)
        if session is not None:
            self.drop_session(session)

    # --- models ----------------------------------------------------------------------------------

    def create_model(self, tenant: str, body: Mapping[str, Any]) -> tuple[Future, str]:
        fields = Fields(body)
        session = self._session(tenant, fields.text("session_id"))
        self._check_base(fields.text("base_model", None))
        optimizer = fields.obj("optimizer_config").text("type", "adamw")
        if optimizer != "adamw":
            raise RequestError(400, f"optimizer {shown(optimizer)} is not supported; skyrl-tinker implements adamw only")
        lora = fields.obj("lora_config")
        if not lora:
            raise RequestError(400, "full fine-tuning (no lora_config) is not supported; skyrl-tinker trains LoRA adapters")
        rank = lora.integer("rank", 0)
        if not 1 <= rank <= MAX_LORA_RANK:
            raise RequestError(400, f"LoRA rank must be between 1 and {MAX_LORA_RANK}, got {rank} "
                                    "(full fine-tuning, rank 0, is not supported)")
        seed = lora.integer("seed", None)
        if seed is None and self.seeds is not None:
            seed = self.seeds.for_adapter(tenant)
        spec = AdapterSpec(rank=rank, seed=seed, train_attn=lora.flag("train_attn", True),
                           train_mlp=lora.flag("train_mlp", True))
        model_id = new_run_id()
        return self._register(tenant, session, model_id, model_id, spec, None), model_id

    def _register(self, tenant: str, session: Session, model_id: str, run_id: str, spec: AdapterSpec,
                  load: TinkerPath | None, optimizer: bool = False) -> Future:
        if model_id in self.models:
            raise RequestError(400, f"model {shown(model_id)} already exists")
        _check_limit(tenant, sum(m.tenant == tenant for m in list(self.models.values())), self.limits.adapters,
                     "models (LoRA adapters)", "--max-adapters",
                     "unload the models you are done with, or close their ServiceClients", _DO_NOT_RETRY)
        future = self._new_future(tenant, "create_model", session.session_id)
        self.models[model_id] = ModelInfo(model_id, run_id, tenant, session.session_id, spec)
        session.models.add(model_id)

        def run(backend: Backend) -> dict[str, Any]:
            try:
                backend.create(model_id, spec)
                if load is not None:
                    weights, _, opt = self.checkpoints.load(load, optimizer=optimizer)
                    backend.load_state(model_id, weights, opt)
                self.checkpoints.write_run(run_id, tenant, self.backend.base_model_name, spec.to_dict())
            except Exception:
                self.models.pop(model_id, None)
                backend.drop(model_id)
                raise
            if load is not None:
                return {"type": "load_weights", "path": str(load), "model_id": model_id}
            return {"type": "create_model", "model_id": model_id}

        self.worker.submit(Job(future, model_id, run=run))
        return future

    def get_info(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        info = self._model(tenant, Fields(body).text("model_id"))
        return {"type": "get_info", "model_id": info.model_id, "is_lora": True, "lora_rank": info.spec.rank,
                "model_name": self.backend.base_model_name,
                "model_data": {"arch": self.backend.arch, "model_name": self.backend.base_model_name,
                               "tokenizer_id": self.backend.tokenizer_source}}

    def unload_model(self, tenant: str, body: Mapping[str, Any]) -> Future:
        info = self._model(tenant, Fields(body).text("model_id"))
        future = self._new_future(tenant, "unload_model", info.session_id)
        self.models.pop(info.model_id)

        def run(backend: Backend) -> dict[str, Any]:
            backend.drop(info.model_id)
            return {"type": "unload_model", "model_id": info.model_id}

        self.worker.submit(Job(future, info.model_id, run=run))
        return future

    # --- training --------------------------------------------------------------------------------

    def forward_backward(self, tenant: str, request: ForwardBackwardIn) -> Future:
        info = self._model(tenant, request.model_id)
        try:
            self.backend.check_batch(request.data, request.loss_fn, request.loss_fn_config)
        except LossInputError as exc:
            raise RequestError(400, str(exc)) from None
        future = self._new_future(tenant, "forward" if request.forward_only else "forward_backward", info.session_id)
        self.worker.submit(Job(future, info.model_id, fb=request))
        return future

    def optim_step(self, tenant: str, body: Mapping[str, Any]) -> Future:
        info = self._model(tenant, Fields(body).text("model_id"))
        raw = body.get("adam_params") or body.get("optim_params")
        if raw is None:
            raise RequestError(400, "optim_step needs adam_params; other optimizers are not supported")
        params = _adam_params(Fields(raw, "adam_params"))

        def run(backend: Backend) -> dict[str, Any]:
            metrics = backend.optim_step(info.model_id, params)
            bad = [k for k, v in metrics.items() if not math.isfinite(v)]
            if bad:  # the step was applied: say so, with the values as they are (JSON has no NaN: as text)
                log.warning("optim_step of model %s was applied with non-finite %s", info.model_id, bad)
            return {"metrics": {k: v if math.isfinite(v) else str(v) for k, v in metrics.items()}}

        return self._queue(info, "optim_step", run)

    # --- checkpoints -----------------------------------------------------------------------------

    def save_weights(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        info = self._model(tenant, fields.text("model_id"))
        path = self._new_path(info.run_id, "weights", fields.text("path", None))
        overwrite = fields.flag("overwrite")

        def run(backend: Backend) -> dict[str, Any]:
            self.checkpoints.save(path, backend.adapter_state(info.model_id), self._meta(info, body),
                                  backend.optimizer_state(info.model_id), overwrite=overwrite)
            return {"type": "save_weights", "path": str(path)}

        return self._queue(info, "save_weights", run)

    def save_weights_for_sampler(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        info = self._model(tenant, fields.text("model_id"))
        name = fields.text("path", None)
        if name is None and body.get("sampling_session_seq_id") is None:
            raise RequestError(400, "save_weights_for_sampler needs a path or a sampling_session_seq_id")
        path = self._new_path(info.run_id, "sampler_weights", name) if name is not None else None
        if path is None:  # a 429 now, which the client retries, rather than a failed request later
            with self._sampling_lock:
                self._make_room(tenant)

        def run(backend: Backend) -> dict[str, Any]:
            state = backend.adapter_state(info.model_id)
            if path is not None:
                self.checkpoints.save(path, state, self._meta(info, body), overwrite=True)
                return {"type": "save_weights_for_sampler", "path": str(path)}
            info.sampler_seq += 1
            weights = SamplerWeights(f"{info.model_id}:ephemeral:{info.sampler_seq}", state, info.spec.rank)
            try:
                sampling_id = self._add_sampling(info.tenant, info.session_id, weights, None)
            except RequestError as exc:  # its session ended meanwhile, or every sampling session got busy
                raise ValueError(exc.message) from None
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampling_id}

        return self._queue(info, "save_weights_for_sampler", run)

    def load_weights(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        path = self._path(fields.text("path"))
        optimizer = fields.flag("optimizer")
        if body.get("session_id") is not None:  # create-via-load: the load is the model's first request
            session = self._session(tenant, fields.text("session_id"))
            run_info = self._readable(tenant, path)
            self._check_base(fields.text("base_model", None))
            spec = AdapterSpec(**run_info["lora"])
            # the client derives this model id itself; the model's checkpoints go to a fresh run
            model_id = f"{session.session_id}:train:{fields.integer('model_seq_id', 0, lo=0)}"
            return self._register(tenant, session, model_id, new_run_id(), spec, path, optimizer)
        info = self._model(tenant, fields.text("model_id"))
        if self._readable(tenant, path)["lora"] != info.spec.to_dict():
            raise RequestError(400, f"checkpoint {shown(str(path))} has a different LoRA config than model {shown(info.model_id)}")

        def run(backend: Backend) -> dict[str, Any]:
            weights, _, opt = self.checkpoints.load(path, optimizer=optimizer)
            backend.load_state(info.model_id, weights, opt)
            return {"type": "load_weights", "path": str(path), "model_id": info.model_id}

        return self._queue(info, "load_weights", run)

    def _meta(self, info: ModelInfo, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"model_id": info.model_id, "base_model": self.backend.base_model_name, "lora": info.spec.to_dict(),
                "user_metadata": body.get("user_metadata")}

    def _new_path(self, run_id: str, kind: str, name: str | None) -> TinkerPath:
        if not name:
            raise RequestError(400, "a checkpoint name (path) is required")
        try:
            return TinkerPath(run_id, kind, name)
        except CheckpointError:
            raise RequestError(400, f"checkpoint name {shown(name)} must be letters, digits, '.', '_' or '-'") from None

    def _path(self, path: str) -> TinkerPath:
        try:
            return TinkerPath.parse(path)
        except CheckpointError as exc:
            raise RequestError(400, str(exc)) from None

    def list_checkpoints(self, tenant: str, run_id: str) -> dict[str, Any]:
        self._own_run(tenant, run_id)
        return {"checkpoints": self.checkpoints.list(run_id), "cursor": None}

    def training_run(self, tenant: str, run_id: str) -> dict[str, Any]:
        return self._training_run(run_id, self._own_run(tenant, run_id))

    def _training_run(self, run_id: str, run: Mapping[str, Any]) -> dict[str, Any]:
        checkpoints = self.checkpoints.list(run_id)
        last = {ctype: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == ctype), None)
                for ctype in ("training", "sampler")}
        return {"training_run_id": run_id, "base_model": run["base_model"], "model_owner": run["owner"],
                "is_lora": True, "lora_rank": run["lora"]["rank"], "corrupted": False,
                "last_request_time": datetime.fromtimestamp(run["created"], UTC).isoformat(),
                "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"],
                "user_metadata": None}

    def training_runs(self, tenant: str, limit: int, offset: int) -> dict[str, Any]:
        """The tenant's own runs only."""
        mine = self.checkpoints.runs(tenant)
        page = [self._training_run(run_id, run) for run_id, run in mine[offset:offset + limit]]
        return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(mine)}}

    def _own_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> TinkerPath:
        path = self._path(f"tinker://{run_id}/{checkpoint_id}")
        self._own_run(tenant, path.run_id)
        return path

    def delete_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> None:
        path = self._own_checkpoint(tenant, run_id, checkpoint_id)
        try:
            self.checkpoints.delete(path)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def publish_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str, public: bool) -> None:
        """Publish (every tenant may then load and sample it, by its path) or unpublish one of the
        tenant's checkpoints. Idempotent (the client retries a 409 for minutes)."""
        path = self._own_checkpoint(tenant, run_id, checkpoint_id)
        try:
            self.checkpoints.set_public(path, public)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def weights_info(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        run = self._readable(tenant, self._path(Fields(body).text("tinker_path")))
        return {"base_model": run["base_model"], "is_lora": True, "lora_rank": run["lora"]["rank"],
                "train_attn": run["lora"]["train_attn"], "train_mlp": run["lora"]["train_mlp"],
                "train_unembed": False}

    # --- sampling --------------------------------------------------------------------------------

    def create_sampling_session(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        fields = Fields(body)
        session = self._session(tenant, fields.text("session_id"))
        model_path = fields.text("model_path", None)
        if model_path:
            weights = self._checkpoint_weights(tenant, model_path)
        else:
            self._check_base(fields.text("base_model", None))
            weights = self.base_weights
        sampling_id = self._add_sampling(tenant, session.session_id, weights, model_path)
        return {"type": "create_sampling_session", "sampling_session_id": sampling_id}

    def _add_sampling(self, tenant: str, session_id: str, weights: SamplerWeights, model_path: str | None) -> str:
        """Open a sampling session in ``session_id`` (which must still be open: a session's sampling
        sessions end with it), making room for it under the tenant's limit first."""
        sampling_id = f"smp-{secrets.token_hex(16)}"
        with self._sampling_lock:
            session = self.sessions.get(session_id)
            if session is None or session.finished:
                raise RequestError(404, f"unknown or expired session {shown(session_id)} "
                                        "(sessions end when heartbeats stop)")
            self._make_room(tenant)
            self.sampling[sampling_id] = SamplingSession(sampling_id, tenant, session_id, weights, model_path,
                                                         next(self._ticks))
            session.samplers.add(sampling_id)
        return sampling_id

    def _make_room(self, tenant: str) -> None:
        """Close the tenant's least recently used idle sampling sessions until one more fits its limit
        (the client opens one per SamplingClient and never closes them: an RL loop opens one a step);
        429 when every one is busy (see ``SamplingSession.busy``). Called with the lock held."""
        mine = sorted((s for s in self.sampling.values() if s.tenant == tenant), key=lambda s: s.last_used)
        excess = len(mine) - self.limits.sampling_sessions + 1
        if excess <= 0:
            return
        idle = [s for s in mine if not s.busy(self.futures)]
        _check_limit(tenant, len(mine) - len(idle), self.limits.sampling_sessions,
                     "sampling sessions with samples queued, running or not yet collected", "--max-sampling-sessions",
                     "the least recently used idle one is closed when another opens, so collect the results of "
                     "samples sent", _RETRY_SOON)
        for sampling in idle[:excess]:
            self._close_sampling(sampling.sampling_session_id, self.sessions.get(sampling.session_id))

    def _close_sampling(self, sampling_id: str, session: Session | None) -> None:
        """Forget a sampling session and its completion logs (its weights go with their last user)."""
        self.sampling.pop(sampling_id, None)
        if session is not None:
            session.samplers.discard(sampling_id)
        self.futures.forget_sampling_session(sampling_id)

    def _used(self, sampling: SamplingSession, sample: Future) -> None:
        with self._sampling_lock:
            sampling.busy(self.futures)  # drops the samples collected
            sampling.last_used = next(self._ticks)
            sampling.samples.append(sample)

    def _checkpoint_weights(self, tenant: str, model_path: str) -> SamplerWeights:
        """A checkpoint's weights, read from disk only when no sampling session or sample holds them."""
        path = self._path(model_path)
        self._readable(tenant, path)
        try:
            weights = self.loaded_weights.get(_weights_key(path, self.checkpoints.meta(path)))
            if weights is None:
                state, meta, _ = self.checkpoints.load(path)
                weights = SamplerWeights(_weights_key(path, meta), state, int(meta["lora"]["rank"]))
                weights = self.loaded_weights.setdefault(weights.key, weights)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None
        return weights

    def sampler_info(self, tenant: str, sampling_id: str) -> dict[str, Any]:
        sampling = self._sampling(tenant, sampling_id)
        return {"sampler_id": sampling_id, "base_model": self.backend.base_model_name,
                "model_path": sampling.model_path}

    async def retrieve_futures(self, tenant: str, body: Mapping[str, Any], max_wait: float) -> dict[str, Any]:
        """Completions of one sampling session since the client's cursor (see ``futures.CompletionLog``)."""
        fields = Fields(body)
        target = fields.obj("target")
        kind = target.text("type", "sampling_session")
        if kind != "sampling_session":
            raise RequestError(400, f"retrieve_futures polls sampling sessions only, not {shown(kind)}")
        sampling_id = target.text("sampling_session_id")
        key = (sampling_id, target.integer("cloned_sampler_id", 0, lo=0, hi=MAX_CLONES - 1))
        wait = min(fields.number("timeout", max_wait, lo=0.0), max_wait)
        cursor = fields.integer("prev_cursor", 0)
        retrieved = [str(i) for i in _at_most(fields.items("retrieved_request_ids"), MAX_RETRIEVED_IDS,
                                               "retrieved_request_ids")]
        self._sampling(tenant, sampling_id)
        found, cursor = await self.futures.completions(key, cursor, wait, retrieved)
        return {"completions": [_completion(f) for f in found], "cursor": cursor}

    def asample(self, tenant: str, body: Mapping[str, Any]) -> tuple[Future, list[str]]:
        fields = Fields(body)
        target = None
        if body.get("sampling_session_id") is not None:
            sampling_id = fields.text("sampling_session_id")
            sampling = self._sampling(tenant, sampling_id)
            weights, session_id = sampling.weights, sampling.session_id
            seq_id = fields.integer("seq_id", 0, lo=0, hi=MAX_CLONES * CLONE_SEQ_IDS - 1)
            target = (sampling_id, seq_id // CLONE_SEQ_IDS)
        elif body.get("model_path"):  # a one-off sample from a checkpoint, no sampling session
            weights, session_id = self._checkpoint_weights(tenant, fields.text("model_path")), None
        else:
            self._check_base(fields.text("base_model", None) or None)
            weights, session_id = self.base_weights, None
        for key, feature in UNSUPPORTED_SAMPLE_FIELDS.items():
            if body.get(key):
                raise RequestError(400, f"{feature} ({key}) are not supported by skyrl-tinker")
        prompt = _prompt_tokens(fields.obj("prompt"))
        vocab = self.backend.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if not prompt or bad:
            raise RequestError(400, "prompt is empty" if not prompt else
                               f"prompt has token ids outside the vocabulary (size {vocab}): {bad[:5]}")
        n = fields.integer("num_samples", 1, lo=1, hi=MAX_NUM_SAMPLES)
        params = _sampling_params(fields.obj("sampling_params"), n, len(prompt), self.backend.max_context)
        if params.seed is None and self.seeds is not None:
            params = params.model_copy(update={"seed": self.seeds.for_sample(tenant, prompt, params, n)})
        last_n = fields.integer("prompt_logprobs_last_n", None, lo=1, hi=len(prompt) - 1)
        topk = fields.integer("topk_prompt_logprobs", 0, lo=0, hi=MAX_TOPK)
        future = self._new_future(tenant, "sample", session_id, target)
        if target is not None:
            self._used(sampling, future)
        self.sampler.submit(SampleJob(future, weights, prompt, n, params, fields.flag("prompt_logprobs"), last_n, topk))
        return future, [f"{future.request_id}:{i}" for i in range(n)]

    # --- session ends ------------------------------------------------------------------------------

    def drop_session(self, session: Session) -> None:
        """Free what a finished or reaped session held (checkpoints on disk stay)."""
        for model_id in list(session.models):
            if self.models.pop(model_id, None) is not None:
                self.worker.submit(Job(None, model_id, run=partial(_drop, model_id), tenant=session.tenant))
        with self._sampling_lock:
            for sampling_id in list(session.samplers):
                self._close_sampling(sampling_id, session)
        for future in self.futures.forget_session(session.session_id):
            if future.kind == "sample":  # nobody will fetch it: stop decoding it
                self._stop_sample(future, "its session was reaped")

    def cancel_future(self, tenant: str, body: Mapping[str, Any]) -> None:
        """The client abandoned a sampling request: its future fails (``cancelled``) and its decoding stops."""
        future = self.future(tenant, Fields(body).text("request_id"))
        if future.kind != "sample":
            raise RequestError(400, f"only sampling requests can be cancelled; {future.request_id!r} is a "
                                    f"{future.kind} request")
        self._stop_sample(future, "cancelled by the client")

    def _stop_sample(self, future: Future, reason: str) -> None:
        """Fail an unfinished sample (the sampler skips a job whose future is settled) and stop its decoding."""
        if not future.done:
            self.futures.fail(future, reason, "user")
            self.sampler.cancel(future.request_id)

    def reap(self) -> int:
        """Drop silent sessions (and finished futures older than ``FUTURE_TTL``); returns sessions reaped."""
        self.futures.prune(FUTURE_TTL)
        gone = self.sessions.expired()
        for session in gone:
            log.info("session %s stopped sending heartbeats; reaped", session.session_id)
            self.drop_session(session)
        return len(gone)


def _check_limit(tenant: str, used: int, limit: int, what: str, option: str, hint: str,
                 headers: Mapping[str, str]) -> None:
    if used >= limit:
        raise RequestError(429, f"tenant {tenant!r} already has {used} {what}, the most one tenant may have "
                                f"({option} {limit}); {hint}", headers)


def _at_most(items: list[Any], most: int, name: str) -> list[Any]:
    """``items`` if there are at most ``most`` (work per request stays bounded whatever the body's size)."""
    if len(items) > most:
        raise FieldError(f"{name} may hold at most {most} entries, got {len(items)}")
    return items


def _adam_params(raw: Fields) -> dict[str, float]:
    """Tinker's AdamParams within ``ADAM_BOUNDS`` (``ADAM_DEFAULTS`` for those not sent)."""
    kind = raw.text("type", "adam")
    if kind not in ("adam", "adamw"):
        raise RequestError(400, f"optimizer {shown(kind)} is not supported; skyrl-tinker implements adamw only")
    params = {key: raw.number(key, default, lo=ADAM_BOUNDS[key][0], hi=ADAM_BOUNDS[key][1], nullable=False)
              for key, default in ADAM_DEFAULTS.items()}
    for key in ("beta1", "beta2"):
        if params[key] >= 1:
            raise FieldError(f"adam_params.{key} must be below 1, got {params[key]}")
    if params["learning_rate"] * params["weight_decay"] > 1:
        raise FieldError("adam_params.learning_rate x adam_params.weight_decay must be at most 1 (AdamW multiplies "
                         f"every weight by 1 - their product each step), got {params['learning_rate']:g} x "
                         f"{params['weight_decay']:g}")
    return params


def _prompt_tokens(prompt: Fields) -> list[int]:
    tokens: list[int] = []
    for i, raw in enumerate(prompt.items("chunks")):
        chunk = Fields(raw, f"prompt.chunks[{i}]")
        kind = chunk.text("type", "encoded_text")
        if kind != "encoded_text":
            raise RequestError(400, f"prompt chunk type {shown(kind)} is not supported (token chunks only)")
        tokens += integers(chunk.items("tokens"), f"prompt.chunks[{i}].tokens")
    return tokens


def _sampling_params(raw: Fields, num_samples: int, prompt_len: int, max_context: int | None) -> SamplingParams:
    stop = raw.data.get("stop")
    strings: list[str] = []
    ids: list[int] = []
    if isinstance(stop, str):
        strings = [stop]
    elif isinstance(stop, list):
        _at_most(stop, MAX_STOP_SEQUENCES, "sampling_params.stop")
        strings = [s for s in stop if isinstance(s, str)]
        ids = integers([s for s in stop if not isinstance(s, str)], "sampling_params.stop")
    elif stop is not None:
        raise FieldError("sampling_params.stop must be a string or a list of strings or token ids")
    if any(len(text) > MAX_STOP_CHARS for text in strings):
        raise FieldError(f"sampling_params.stop strings may have at most {MAX_STOP_CHARS} characters each")
    if max_context is not None and prompt_len >= max_context:
        raise RequestError(400, f"prompt has {prompt_len} tokens, the model's context is {max_context}")
    seed = raw.integer("seed", None)
    if seed is not None and seed + num_samples - 1 > INT64_MAX:
        raise FieldError(f"sampling_params.seed + num_samples - 1 must fit an int64 (sample i uses seed + i), "
                         f"got seed {seed}")
    try:
        return SamplingParams(max_tokens=raw.integer("max_tokens", DEFAULT_MAX_TOKENS, lo=1),
                              temperature=raw.number("temperature", 1.0, lo=0.0, hi=MAX_TEMPERATURE),
                              top_p=raw.number("top_p", 1.0, lo=0.0, hi=1.0, above=True),
                              top_k=raw.integer("top_k", -1), stop=strings, stop_token_ids=ids, seed=seed,
                              ignore_eos=isinstance(stop, list) and not stop)  # Tinker: [] disables EOS too
    except ValidationError as exc:
        raise RequestError(400, f"bad sampling_params: {validation_detail(exc.errors())}") from None


def _weights_key(path: TinkerPath, meta: Mapping[str, Any]) -> str:
    """Names a checkpoint's weights as saved: a checkpoint saved over must not pass for the one the
    engine holds, nor share its loaded copy."""
    return f"{path}@{meta.get('time')}"


def _drop(model_id: str, backend: Backend) -> dict[str, Any]:
    backend.drop(model_id)
    return {}


def _completion(future: Future) -> dict[str, Any]:
    if future.error is not None:
        return {"state": "failed", "request_id": future.request_id}
    size = len(future.result) if isinstance(future.result, bytes) else None
    return {"state": "finished", "request_id": future.request_id, "response_payload_uncompressed_size": size}


Owned = TypeVar("Owned")


def _owned(item: Owned | None, tenant: str, message: str) -> Owned:
    """``item`` when ``tenant`` owns it; else the 404 an id never issued gets, so no tenant learns another's ids."""
    if item is None or getattr(item, "tenant", None) != tenant:
        raise RequestError(404, message)
    return item
