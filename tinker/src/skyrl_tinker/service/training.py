"""Models and training (:mod:`skyrl_tinker.routes.training`): creating and unloading LoRA models,
forward(-backward) passes, optimizer steps, and saving and loading their weights. Each is checked here,
then queued on the training worker as a :class:`~skyrl_tinker.futures.Future`."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from skyrl_core.http_hygiene import shown

from skyrl_tinker.backend import ADAM_DEFAULTS, AdapterSpec, Backend
from skyrl_tinker.checkpoints import CheckpointError, TinkerPath, new_run_id
from skyrl_tinker.fields import FLOAT32_MAX, FieldError, Fields
from skyrl_tinker.futures import Future, Result
from skyrl_tinker.losses import LossInputError
from skyrl_tinker.sampler import SamplerWeights
from skyrl_tinker.service.state import DO_NOT_RETRY, ModelInfo, RequestError, ServerState, check_limit, parse_path
from skyrl_tinker.sessions import Session
from skyrl_tinker.wire import ForwardBackwardIn
from skyrl_tinker.worker import Job

log = logging.getLogger(__name__)

MAX_LORA_RANK = 256
# (lo, hi) of each AdamParams field: a step size over 1, or an eps over 1, is no optimizer setting anyone means
ADAM_BOUNDS = {"learning_rate": (0.0, 1.0), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0), "eps": (0.0, 1.0),
               "weight_decay": (0.0, 1e4), "grad_clip_norm": (0.0, FLOAT32_MAX)}


class TrainingRequests:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    # --- models ----------------------------------------------------------------------------------

    def create_model(self, tenant: str, body: Mapping[str, Any]) -> tuple[Future, str]:
        fields = Fields(body)
        session = self.state.session(tenant, fields.text("session_id"))
        self.state.check_base(fields.text("base_model", None))
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
        if seed is None and self.state.seeds is not None:
            seed = self.state.seeds.for_adapter(tenant)
        spec = AdapterSpec(rank=rank, seed=seed, train_attn=lora.flag("train_attn", True),
                           train_mlp=lora.flag("train_mlp", True))
        model_id = new_run_id()
        return self._register(tenant, session, model_id, model_id, spec, None), model_id

    def _register(self, tenant: str, session: Session, model_id: str, run_id: str, spec: AdapterSpec,
                  load: TinkerPath | None, optimizer: bool = False) -> Future:
        state = self.state
        if model_id in state.models:
            raise RequestError(400, f"model {shown(model_id)} already exists")
        check_limit(tenant, sum(m.tenant == tenant for m in list(state.models.values())), state.limits.adapters,
                    "models (LoRA adapters)", "--max-adapters",
                    "unload the models you are done with, or close their ServiceClients", DO_NOT_RETRY)
        future = state.new_future(tenant, "create_model", session.session_id)
        state.models[model_id] = ModelInfo(model_id, run_id, tenant, session.session_id, spec)
        session.models.add(model_id)

        def run(backend: Backend) -> dict[str, Any]:
            try:
                backend.create(model_id, spec)
                if load is not None:
                    weights, _, opt = state.checkpoints.load(load, optimizer=optimizer)
                    backend.load_state(model_id, weights, opt)
                state.checkpoints.write_run(run_id, tenant, state.backend.base_model_name, spec.to_dict())
            except Exception:
                state.models.pop(model_id, None)
                backend.drop(model_id)
                raise
            if load is not None:
                return {"type": "load_weights", "path": str(load), "model_id": model_id}
            return {"type": "create_model", "model_id": model_id}

        state.worker.submit(Job(future, model_id, run=run))
        return future

    def get_info(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        info = self.state.model(tenant, Fields(body).text("model_id"))
        backend = self.state.backend
        return {"type": "get_info", "model_id": info.model_id, "is_lora": True, "lora_rank": info.spec.rank,
                "model_name": backend.base_model_name,
                "model_data": {"arch": backend.arch, "model_name": backend.base_model_name,
                               "tokenizer_id": backend.tokenizer_source}}

    def unload_model(self, tenant: str, body: Mapping[str, Any]) -> Future:
        info = self.state.model(tenant, Fields(body).text("model_id"))
        future = self.state.new_future(tenant, "unload_model", info.session_id)
        self.state.models.pop(info.model_id)

        def run(backend: Backend) -> dict[str, Any]:
            backend.drop(info.model_id)
            return {"type": "unload_model", "model_id": info.model_id}

        self.state.worker.submit(Job(future, info.model_id, run=run))
        return future

    # --- training --------------------------------------------------------------------------------

    def forward_backward(self, tenant: str, request: ForwardBackwardIn) -> Future:
        info = self.state.model(tenant, request.model_id)
        try:
            self.state.backend.check_batch(request.data, request.loss_fn, request.loss_fn_config)
        except LossInputError as exc:
            raise RequestError(400, str(exc)) from None
        kind = "forward" if request.forward_only else "forward_backward"
        future = self.state.new_future(tenant, kind, info.session_id)
        self.state.worker.submit(Job(future, info.model_id, fb=request))
        return future

    def optim_step(self, tenant: str, body: Mapping[str, Any]) -> Future:
        info = self.state.model(tenant, Fields(body).text("model_id"))
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

    def _queue(self, info: ModelInfo, kind: str, run: Callable[[Backend], Result]) -> Future:
        future = self.state.new_future(info.tenant, kind, info.session_id)
        self.state.worker.submit(Job(future, info.model_id, run=run))
        return future

    # --- weights ---------------------------------------------------------------------------------

    def save_weights(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        info = self.state.model(tenant, fields.text("model_id"))
        path = _new_path(info.run_id, "weights", fields.text("path", None))
        overwrite = fields.flag("overwrite")

        def run(backend: Backend) -> dict[str, Any]:
            self.state.checkpoints.save(path, backend.adapter_state(info.model_id), self._meta(info, body),
                                        backend.optimizer_state(info.model_id), overwrite=overwrite)
            return {"type": "save_weights", "path": str(path)}

        return self._queue(info, "save_weights", run)

    def save_weights_for_sampler(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        info = self.state.model(tenant, fields.text("model_id"))
        name = fields.text("path", None)
        if name is None and body.get("sampling_session_seq_id") is None:
            raise RequestError(400, "save_weights_for_sampler needs a path or a sampling_session_seq_id")
        path = _new_path(info.run_id, "sampler_weights", name) if name is not None else None
        if path is None:  # a 429 now, which the client retries, rather than a failed request later
            self.state.make_room(tenant)

        def run(backend: Backend) -> dict[str, Any]:
            adapter = backend.adapter_state(info.model_id)
            if path is not None:
                self.state.checkpoints.save(path, adapter, self._meta(info, body), overwrite=True)
                return {"type": "save_weights_for_sampler", "path": str(path)}
            info.sampler_seq += 1
            weights = SamplerWeights(f"{info.model_id}:ephemeral:{info.sampler_seq}", adapter, info.spec.rank)
            try:
                sampling_id = self.state.add_sampling(info.tenant, info.session_id, weights, None)
            except RequestError as exc:  # its session ended meanwhile, or every sampling session got busy
                raise ValueError(exc.message) from None
            return {"type": "save_weights_for_sampler", "sampling_session_id": sampling_id}

        return self._queue(info, "save_weights_for_sampler", run)

    def load_weights(self, tenant: str, body: Mapping[str, Any]) -> Future:
        fields = Fields(body)
        path = parse_path(fields.text("path"))
        optimizer = fields.flag("optimizer")
        if body.get("session_id") is not None:  # create-via-load: the load is the model's first request
            session = self.state.session(tenant, fields.text("session_id"))
            run_info = self.state.readable(tenant, path)
            self.state.check_base(fields.text("base_model", None))
            spec = AdapterSpec(**run_info["lora"])
            # the client derives this model id itself; the model's checkpoints go to a fresh run
            model_id = f"{session.session_id}:train:{fields.integer('model_seq_id', 0, lo=0)}"
            return self._register(tenant, session, model_id, new_run_id(), spec, path, optimizer)
        info = self.state.model(tenant, fields.text("model_id"))
        if self.state.readable(tenant, path)["lora"] != info.spec.to_dict():
            raise RequestError(400, f"checkpoint {shown(str(path))} has a different LoRA config than model {shown(info.model_id)}")

        def run(backend: Backend) -> dict[str, Any]:
            weights, _, opt = self.state.checkpoints.load(path, optimizer=optimizer)
            backend.load_state(info.model_id, weights, opt)
            return {"type": "load_weights", "path": str(path), "model_id": info.model_id}

        return self._queue(info, "load_weights", run)

    def _meta(self, info: ModelInfo, body: Mapping[str, Any]) -> dict[str, Any]:
        return {"model_id": info.model_id, "base_model": self.state.backend.base_model_name,
                "lora": info.spec.to_dict(), "user_metadata": body.get("user_metadata")}


def _new_path(run_id: str, kind: str, name: str | None) -> TinkerPath:
    if not name:
        raise RequestError(400, "a checkpoint name (path) is required")
    try:
        return TinkerPath(run_id, kind, name)
    except CheckpointError:
        raise RequestError(400, f"checkpoint name {shown(name)} must be letters, digits, '.', '_' or '-'") from None


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
