"""What each Tinker request does: validation, then work queued on the training worker or the sampler.

HTTP-free (``app.py`` maps routes onto these methods): every method either returns a JSON-ready
dict, returns a :class:`~skyrl_tinker.futures.Future` for queued work, or raises
:class:`RequestError` with an HTTP status and a message naming what was wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from skyrl_core.engine import SamplingParams

from skyrl_tinker.backend import AdapterSpec, Backend
from skyrl_tinker.checkpoints import CheckpointError, CheckpointStore, TinkerPath
from skyrl_tinker.futures import Future, FutureStore, Result
from skyrl_tinker.losses import LossInputError
from skyrl_tinker.sampler import SampleJob, Sampler, SamplerWeights
from skyrl_tinker.sessions import Session, SessionRegistry
from skyrl_tinker.wire import ForwardBackwardIn
from skyrl_tinker.worker import Job, TrainWorker

log = logging.getLogger(__name__)

MAX_NUM_SAMPLES = 128
DEFAULT_MAX_TOKENS = 256
FUTURE_TTL = 3600.0  # seconds a finished result stays retrievable
MAX_TOPK = 64
UNSUPPORTED_SAMPLE_FIELDS = {"topk_sample_logprobs": "top-k sample logprobs",
                             "target_prompt_logprobs": "target prompt logprobs",
                             "prompt_alt_tokens_k": "prompt alternative tokens"}


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ModelInfo:
    model_id: str
    session_id: str
    spec: AdapterSpec
    sampler_seq: int = 0


@dataclass
class SamplingSession:
    sampling_session_id: str
    session_id: str
    weights: SamplerWeights
    model_path: str | None


class TinkerService:
    def __init__(self, backend: Backend, sampler: Sampler, checkpoints: CheckpointStore,
                 sessions: SessionRegistry, futures: FutureStore) -> None:
        self.backend = backend
        self.sampler = sampler
        self.checkpoints = checkpoints
        self.sessions = sessions
        self.futures = futures
        self.worker = TrainWorker(backend, futures)
        self.models: dict[str, ModelInfo] = {}
        self.sampling: dict[str, SamplingSession] = {}
        self.base_weights = SamplerWeights("base", {})

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

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError(404, f"unknown or expired session {session_id!r} (sessions end when heartbeats stop)")
        return session

    def _model(self, model_id: str) -> ModelInfo:
        info = self.models.get(model_id)
        if info is None:
            raise RequestError(404, f"unknown model id {model_id!r}; create it with create_model or load_weights")
        return info

    def _check_base(self, base_model: str | None) -> None:
        if base_model not in (None, self.backend.base_model_name, self.backend.tokenizer_source):
            raise RequestError(400, f"base model {base_model!r} is not served here; this server serves "
                                    f"{self.backend.base_model_name!r} (skyrl-tinker serve --base-model)")

    def _queue(self, kind: str, model_id: str | None, session_id: str | None,
               run: Callable[[Backend], Result]) -> Future:
        future = self.futures.create(kind, session_id)
        self.worker.submit(Job(future, model_id, run=run))
        return future

    # --- models ----------------------------------------------------------------------------------

    def create_model(self, body: Mapping[str, Any]) -> tuple[Future, str]:
        session = self._session(body["session_id"])
        self._check_base(body.get("base_model"))
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise RequestError(400, f"optimizer {optimizer!r} is not supported; skyrl-tinker implements adamw only")
        lora = body.get("lora_config")
        if not lora:
            raise RequestError(400, "full fine-tuning (no lora_config) is not supported; skyrl-tinker trains LoRA adapters")
        spec = AdapterSpec(rank=int(lora.get("rank", 0)), seed=lora.get("seed"),
                           train_attn=bool(lora.get("train_attn", True)), train_mlp=bool(lora.get("train_mlp", True)))
        if spec.rank < 1:
            raise RequestError(400, f"LoRA rank must be >= 1, got {spec.rank}")
        model_id = f"{session.session_id}:train:{int(body['model_seq_id'])}"
        return self._register(session, model_id, spec, None), model_id

    def _register(self, session: Session, model_id: str, spec: AdapterSpec, load: TinkerPath | None,
                  optimizer: bool = False) -> Future:
        if model_id in self.models:
            raise RequestError(409 if load is None else 400, f"model {model_id!r} already exists")
        self.models[model_id] = ModelInfo(model_id, session.session_id, spec)
        session.models.add(model_id)

        def run(backend: Backend) -> dict[str, Any]:
            try:
                backend.create(model_id, spec)
                if load is not None:
                    weights, _, opt = self.checkpoints.load(load, optimizer=optimizer)
                    backend.load_state(model_id, weights, opt)
                self.checkpoints.write_run(model_id, self.backend.base_model_name, spec.to_dict())
            except Exception:
                self.models.pop(model_id, None)
                backend.drop(model_id)
                raise
            if load is not None:
                return {"type": "load_weights", "path": str(load), "model_id": model_id}
            return {"type": "create_model", "model_id": model_id}

        return self._queue("create_model", model_id, session.session_id, run)

    def get_info(self, model_id: str) -> dict[str, Any]:
        info = self._model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": info.spec.rank,
                "model_name": self.backend.base_model_name,
                "model_data": {"arch": self.backend.arch, "model_name": self.backend.base_model_name,
                               "tokenizer_id": self.backend.tokenizer_source}}

    def unload_model(self, model_id: str) -> Future:
        info = self._model(model_id)
        self.models.pop(model_id)

        def run(backend: Backend) -> dict[str, Any]:
            backend.drop(model_id)
            return {"type": "unload_model", "model_id": model_id}

        return self._queue("unload_model", model_id, info.session_id, run)

    # --- training --------------------------------------------------------------------------------

    def forward_backward(self, request: ForwardBackwardIn) -> Future:
        info = self._model(request.model_id)
        try:
            self.backend.check_batch(request.data, request.loss_fn, request.loss_fn_config)
        except LossInputError as exc:
            raise RequestError(400, str(exc)) from None
        future = self.futures.create("forward" if request.forward_only else "forward_backward", info.session_id)
        self.worker.submit(Job(future, request.model_id, fb=request))
        return future

    def optim_step(self, body: Mapping[str, Any]) -> Future:
        info = self._model(body["model_id"])
        params = body.get("adam_params") or body.get("optim_params")
        if params is None:
            raise RequestError(400, "optim_step needs adam_params; other optimizers are not supported")
        if not float(params.get("learning_rate", 1e-4)) >= 0:
            raise RequestError(400, "learning_rate must be >= 0")

        def run(backend: Backend) -> dict[str, Any]:
            return {"metrics": backend.optim_step(info.model_id, params)}

        return self._queue("optim_step", info.model_id, info.session_id, run)

    # --- checkpoints -----------------------------------------------------------------------------

    def save_weights(self, body: Mapping[str, Any]) -> Future:
        info = self._model(body["model_id"])
        path = self._new_path(info.model_id, "weights", body.get("path"))

        def run(backend: Backend) -> dict[str, Any]:
            self.checkpoints.save(path, backend.adapter_state(info.model_id), self._meta(info, body),
                                  backend.optimizer_state(info.model_id), overwrite=bool(body.get("overwrite")))
            return {"type": "save_weights", "path": str(path)}

        return self._queue("save_weights", info.model_id, info.session_id, run)

    def save_weights_for_sampler(self, body: Mapping[str, Any]) -> Future:
        info = self._model(body["model_id"])
        name = body.get("path")
        if name is None and body.get("sampling_session_seq_id") is None:
            raise RequestError(400, "save_weights_for_sampler needs a path or a sampling_session_seq_id")
        path = self._new_path(info.model_id, "sampler_weights", name) if name is not None else None

        def run(backend: Backend) -> dict[str, Any]:
            state = backend.adapter_state(info.model_id)
            if path is not None:
                self.checkpoints.save(path, state, self._meta(info, body), overwrite=True)
                return {"type": "save_weights_for_sampler", "path": str(path)}
            info.sampler_seq += 1
            key = f"{info.model_id}:ephemeral:{info.sampler_seq}"
            sampling_id = f"{info.session_id}:sample:{body['sampling_session_seq_id']}"
            weights = SamplerWeights(key, state, info.spec.rank)
            self.sampling[sampling_id] = SamplingSession(sampling_id, info.session_id, weights, None)
            session = self.sessions.get(info.session_id)
            if session is not None:
                session.samplers.add(sampling_id)
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampling_id}

        return self._queue("save_weights_for_sampler", info.model_id, info.session_id, run)

    def load_weights(self, body: Mapping[str, Any]) -> Future:
        path = self._path(body.get("path"))
        if body.get("session_id") is not None:  # create-via-load: the load is the model's first request
            session = self._session(body["session_id"])
            run_info = self._run_info(path.run_id)
            self._check_base(body.get("base_model"))
            spec = AdapterSpec(**run_info["lora"])
            model_id = f"{session.session_id}:train:{int(body.get('model_seq_id') or 0)}"
            return self._register(session, model_id, spec, path, optimizer=bool(body.get("optimizer")))
        info = self._model(body.get("model_id") or "")
        if self._run_info(path.run_id)["lora"] != info.spec.to_dict():
            raise RequestError(400, f"checkpoint {path} has a different LoRA config than model {info.model_id!r}")
        optimizer = bool(body.get("optimizer"))

        def run(backend: Backend) -> dict[str, Any]:
            weights, _, opt = self.checkpoints.load(path, optimizer=optimizer)
            backend.load_state(info.model_id, weights, opt)
            return {"type": "load_weights", "path": str(path), "model_id": info.model_id}

        return self._queue("load_weights", info.model_id, info.session_id, run)

    def _meta(self, info: ModelInfo, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"model_id": info.model_id, "base_model": self.backend.base_model_name, "lora": info.spec.to_dict(),
                "user_metadata": body.get("user_metadata")}

    def _new_path(self, run_id: str, kind: str, name: str | None) -> TinkerPath:
        if not name:
            raise RequestError(400, "a checkpoint name (path) is required")
        try:
            return TinkerPath.parse(f"tinker://{run_id}/{kind}/{name}")
        except CheckpointError:
            raise RequestError(400, f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-'") from None

    def _path(self, path: str | None) -> TinkerPath:
        try:
            return TinkerPath.parse(path or "")
        except CheckpointError as exc:
            raise RequestError(400, str(exc)) from None

    def _run_info(self, run_id: str) -> dict[str, Any]:
        try:
            return self.checkpoints.read_run(run_id)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def list_checkpoints(self, run_id: str) -> dict[str, Any]:
        self._run_info(run_id)
        return {"checkpoints": self.checkpoints.list(run_id), "cursor": None}

    def training_run(self, run_id: str) -> dict[str, Any]:
        run = self._run_info(run_id)
        checkpoints = self.checkpoints.list(run_id)
        last = {ctype: next((c for c in reversed(checkpoints) if c["checkpoint_type"] == ctype), None)
                for ctype in ("training", "sampler")}
        return {"training_run_id": run_id, "base_model": run["base_model"], "model_owner": "local",
                "is_lora": True, "lora_rank": run["lora"]["rank"], "corrupted": False,
                "last_request_time": datetime.fromtimestamp(run["created"], UTC).isoformat(),
                "last_checkpoint": last["training"], "last_sampler_checkpoint": last["sampler"],
                "user_metadata": None}

    def training_runs(self, limit: int, offset: int) -> dict[str, Any]:
        runs = self.checkpoints.runs()
        page = [self.training_run(r) for r in runs[offset:offset + limit]]
        return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        path = self._path(f"tinker://{run_id}/{checkpoint_id}")
        try:
            self.checkpoints.delete(path)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None

    def weights_info(self, tinker_path: str) -> dict[str, Any]:
        path = self._path(tinker_path)
        run = self._run_info(path.run_id)
        return {"base_model": run["base_model"], "is_lora": True, "lora_rank": run["lora"]["rank"],
                "train_attn": run["lora"]["train_attn"], "train_mlp": run["lora"]["train_mlp"],
                "train_unembed": False}

    # --- sampling --------------------------------------------------------------------------------

    def create_sampling_session(self, body: Mapping[str, Any]) -> dict[str, Any]:
        session = self._session(body["session_id"])
        model_path = body.get("model_path")
        if model_path:
            weights = self._checkpoint_weights(model_path)
        else:
            self._check_base(body.get("base_model"))
            weights = self.base_weights
        sampling_id = f"{session.session_id}:sample:{int(body['sampling_session_seq_id'])}"
        self.sampling[sampling_id] = SamplingSession(sampling_id, session.session_id, weights, model_path)
        session.samplers.add(sampling_id)
        return {"type": "create_sampling_session", "sampling_session_id": sampling_id}

    def _checkpoint_weights(self, model_path: str) -> SamplerWeights:
        path = self._path(model_path)
        try:
            state, meta, _ = self.checkpoints.load(path)
        except CheckpointError as exc:
            raise RequestError(404, str(exc)) from None
        return SamplerWeights(str(path), state, int(meta["lora"]["rank"]))

    def sampler_info(self, sampling_id: str) -> dict[str, Any]:
        sampling = self._sampling(sampling_id)
        return {"sampler_id": sampling_id, "base_model": self.backend.base_model_name,
                "model_path": sampling.model_path}

    async def retrieve_futures(self, body: Mapping[str, Any], max_wait: float) -> dict[str, Any]:
        """Completions of one sampling session since the client's cursor (see ``futures.CompletionLog``)."""
        target = body.get("target") or {}
        if target.get("type", "sampling_session") != "sampling_session":
            raise RequestError(400, f"retrieve_futures polls sampling sessions only, not {target.get('type')!r}")
        self._sampling(target.get("sampling_session_id"))
        timeout = body.get("timeout")
        wait = max_wait if timeout is None else max(0.0, min(float(timeout), max_wait))
        found, cursor = await self.futures.completions(
            (target["sampling_session_id"], int(target.get("cloned_sampler_id") or 0)),
            int(body.get("prev_cursor") or 0), wait, [str(i) for i in body.get("retrieved_request_ids") or []])
        return {"completions": [_completion(f) for f in found], "cursor": cursor}

    def _sampling(self, sampling_id: str | None) -> SamplingSession:
        sampling = self.sampling.get(sampling_id or "")
        if sampling is None:
            raise RequestError(404, f"unknown sampling session {sampling_id!r}")
        return sampling

    def asample(self, body: Mapping[str, Any]) -> tuple[Future, list[str]]:
        target = None
        if body.get("sampling_session_id") is not None:
            sampling = self._sampling(body["sampling_session_id"])
            weights, session_id = sampling.weights, sampling.session_id
            # the client numbers a cloned SamplingClient's requests from clone * 1e9
            target = (body["sampling_session_id"], int(body.get("seq_id") or 0) // 1_000_000_000)
        elif body.get("model_path"):  # a one-off sample from a checkpoint, no sampling session
            weights, session_id = self._checkpoint_weights(body["model_path"]), None
        else:
            self._check_base(body.get("base_model") or self.backend.base_model_name)
            weights, session_id = self.base_weights, None
        for key, feature in UNSUPPORTED_SAMPLE_FIELDS.items():
            if body.get(key):
                raise RequestError(400, f"{feature} ({key}) are not supported by skyrl-tinker")
        prompt = _prompt_tokens(body.get("prompt") or {})
        vocab = self.backend.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if not prompt or bad:
            raise RequestError(400, "prompt is empty" if not prompt else
                               f"prompt has token ids outside the vocabulary (size {vocab}): {bad[:5]}")
        n = int(body.get("num_samples", 1))
        if not 1 <= n <= MAX_NUM_SAMPLES:
            raise RequestError(400, f"num_samples must be between 1 and {MAX_NUM_SAMPLES}, got {n}")
        params = _sampling_params(body.get("sampling_params") or {}, len(prompt), self.backend.max_context)
        last_n = body.get("prompt_logprobs_last_n")
        if last_n is not None and not 1 <= int(last_n) <= len(prompt) - 1:
            raise RequestError(400, f"prompt_logprobs_last_n must be between 1 and {len(prompt) - 1}")
        topk = int(body.get("topk_prompt_logprobs") or 0)
        if not 0 <= topk <= MAX_TOPK:
            raise RequestError(400, f"topk_prompt_logprobs must be between 0 and {MAX_TOPK}, got {topk}")
        future = self.futures.create("sample", session_id, target)
        self.sampler.submit(SampleJob(future, weights, prompt, n, params, bool(body.get("prompt_logprobs")),
                                      None if last_n is None else int(last_n), topk))
        return future, [f"{future.request_id}:{i}" for i in range(n)]

    # --- sessions --------------------------------------------------------------------------------

    def drop_session(self, session: Session) -> None:
        """Free what a finished or reaped session held (checkpoints on disk stay)."""
        for model_id in list(session.models):
            if self.models.pop(model_id, None) is not None:
                self.worker.submit(Job(None, model_id, run=partial(_drop, model_id)))
        for sampling_id in session.samplers:
            self.sampling.pop(sampling_id, None)
            self.futures.forget_sampling_session(sampling_id)
        for future in self.futures.forget_session(session.session_id):
            if future.kind == "sample":  # nobody will fetch it: stop decoding it
                self._stop_sample(future, "its session was reaped")

    def cancel_future(self, body: Mapping[str, Any]) -> None:
        """The client abandoned a sampling request: its future fails (``cancelled``) and its decoding stops."""
        request_id = str(body["request_id"])
        future = self.futures.get(request_id)
        if future is None:
            raise RequestError(404, f"unknown request id {request_id!r} (never issued, or its session was reaped)")
        if future.kind != "sample":
            raise RequestError(400, f"only sampling requests can be cancelled; {request_id!r} is a {future.kind} request")
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


def _prompt_tokens(prompt: Mapping[str, Any]) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.get("chunks", []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise RequestError(400, f"prompt chunk type {chunk.get('type')!r} is not supported (token chunks only)")
        tokens += [int(t) for t in chunk.get("tokens", [])]
    return tokens


def _sampling_params(raw: Mapping[str, Any], prompt_len: int, max_context: int | None) -> SamplingParams:
    stop = raw.get("stop")
    strings: list[str] = []
    ids: list[int] = []
    if isinstance(stop, str):
        strings = [stop]
    elif stop:
        strings = [s for s in stop if isinstance(s, str)]
        ids = [int(s) for s in stop if not isinstance(s, str)]
    max_tokens = raw.get("max_tokens") or DEFAULT_MAX_TOKENS
    if max_context is not None and prompt_len >= max_context:
        raise RequestError(400, f"prompt has {prompt_len} tokens, the model's context is {max_context}")
    try:
        return SamplingParams(max_tokens=int(max_tokens), temperature=float(raw.get("temperature", 1.0)),
                              top_p=float(raw.get("top_p", 1.0)), top_k=int(raw.get("top_k", -1)),
                              stop=strings, stop_token_ids=ids, seed=raw.get("seed"),
                              ignore_eos=isinstance(stop, list) and not stop)  # Tinker: [] disables EOS too
    except ValueError as exc:
        raise RequestError(400, f"bad sampling_params: {exc}") from None


def _drop(model_id: str, backend: Backend) -> dict[str, Any]:
    backend.drop(model_id)
    return {}


def _completion(future: Future) -> dict[str, Any]:
    if future.error is not None:
        return {"state": "failed", "request_id": future.request_id}
    size = len(future.result) if isinstance(future.result, bytes) else None
    return {"state": "finished", "request_id": future.request_id, "response_payload_uncompressed_size": size}
