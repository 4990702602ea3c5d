"""The HTTP surface: FastAPI routes for the ``/api/v1`` endpoints the ``tinker`` client calls.

Routes only parse bodies and shape responses; :mod:`skyrl_tinker.service` does the work. Queued work
answers at once with ``{"request_id": ...}`` and the client polls ``retrieve_future``. Errors are
JSON ``{"detail": "..."}`` with a 4xx status. Endpoints the client knows but this server does not
implement answer 404 naming the feature (not 501: the client retries every 5xx for minutes).
Every request is authenticated to a tenant first (:mod:`skyrl_tinker.tenants`); routes hand it on.
Then core's HTTP hygiene (:mod:`skyrl_core.http_hygiene`) checks it before a route reads it: the
``Host`` (421 for names other than loopback, the bound address and ``allowed_hosts``: a page that
rebinds its name cannot drive the API through a browser), the body size (413 above ``max_body_mb``),
its content type (415 unless JSON or protobuf: no cross-site ``text/plain`` posts) and a JSON body's
nesting and value count (400); a zstd body's JSON is checked the same way once decompressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from skyrl_core.http_hygiene import JSON_TYPES, HttpLimits, HttpProblem, HygieneMiddleware, check_json_structure
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from skyrl_tinker.backend import Backend
from skyrl_tinker.checkpoints import CheckpointStore
from skyrl_tinker.fields import Fields, integers
from skyrl_tinker.futures import FutureStore
from skyrl_tinker.sampler import Sampler, SamplerEngineKind, SamplingEngine, build_sampler_engine
from skyrl_tinker.service import MAX_TOPK, RequestError, TinkerService
from skyrl_tinker.sessions import SessionRegistry
from skyrl_tinker.tenants import DEFAULT_TENANT, Limits, tenant_of
from skyrl_tinker.wire import (
    DatumIn,
    ForwardBackwardIn,
    WireError,
    decompress,
    parse_forward_backward,
    tensor_from_json,
)

log = logging.getLogger(__name__)

API = "/api/v1"
BODY_TYPES = JSON_TYPES | {"application/x-protobuf"}  # what the tinker client sends
RETRIEVE_FUTURES_POLL_SECONDS = 30.0  # the client's poller allows a retrieve_futures call 45 s
POLL_SECONDS = 40.0  # a retrieve_future long-poll (the client times out at 45 s and logs every try_again)
UNSUPPORTED = {
    "copy_weights": "copying weights between projects",
    "create_custom_loss": "server-side custom losses (forward_backward_custom runs client-side)",
    "save_weights_external": "external weight exports",
    "join_sampling_session": "joining sampling sessions",
    "auth/token": "JWT authentication",
}


@dataclass
class ServerConfig:
    base_model: str = "tiny-random"
    device: str = "cpu"
    checkpoint_dir: str = "~/.cache/skyrl/tinker"
    session_timeout: float = 300.0
    max_batch_datums: int = 1024
    max_sample_batch: int = 64
    api_key: str | None = None  # when set, every request must carry it as X-API-Key (one tenant, "default")
    api_keys: Mapping[str, str] | None = None  # key -> tenant (serve --api-keys FILE); not with api_key
    # hf: transformers on ``device``; vllm: vLLM on the first visible GPU (needs skyrl-trainers[vllm] and CUDA)
    sampler_engine: SamplerEngineKind = "hf"
    sampler_gpu_memory_utilization: float = 0.4  # vllm only: the share of the GPU vLLM reserves (rest: trainer)
    max_sessions: int = Limits.sessions  # per tenant
    max_adapters: int = Limits.adapters  # per tenant
    max_queued_requests: int = Limits.queued  # per tenant
    max_body_mb: int = 64  # the largest request body; a zstd body may decompress to 4x this
    allowed_hosts: tuple[str, ...] = ()  # Host names answered beyond loopback and bound_host (serve --allowed-host)
    bound_host: str | None = None  # the address the server listens on (serve --host)

    def tenant_keys(self) -> dict[str, str] | None:
        """API key -> tenant; None in single-user mode (no keys: every request is ``DEFAULT_TENANT``)."""
        if self.api_key is not None and self.api_keys is not None:
            raise ValueError("give api_key (one shared key) or api_keys (a key per tenant), not both")
        if self.api_keys is not None:
            if not self.api_keys:
                raise ValueError("api_keys is empty: give at least one key, or none for single-user mode")
            return dict(self.api_keys)
        return None if self.api_key is None else {self.api_key: DEFAULT_TENANT}

    @property
    def max_decompressed_bytes(self) -> int:
        return 4 * self.max_body_mb * 1024 * 1024

    def http_limits(self) -> HttpLimits:
        """What a request may be before a route reads it. A JSON value costs the parser up to ~60 bytes, so at
        most 4 million values (forward_backward batches travel as protobuf, whose size alone is checked)."""
        return HttpLimits(max_body_bytes=self.max_body_mb * 1024 * 1024, max_json_items=4_000_000,
                          allowed_hosts=self.allowed_hosts, body_types=BODY_TYPES)


def build_service(config: ServerConfig, sampler_engine: SamplingEngine | None = None) -> TinkerService:
    """The service for ``config``; ``sampler_engine`` replaces the engine ``config.sampler_engine`` names
    (the service owns it from here on and closes it when it stops)."""
    futures = FutureStore()
    # the sampler's engine first: a missing vLLM or GPU is reported before the trainer's model loads
    engine = sampler_engine or build_sampler_engine(
        config.sampler_engine, config.base_model, device=config.device, max_batch_size=config.max_sample_batch,
        gpu_memory_utilization=config.sampler_gpu_memory_utilization, max_logprobs=MAX_TOPK)
    try:
        backend = Backend(config.base_model, device=config.device, max_batch_datums=config.max_batch_datums)
    except BaseException:
        engine.close()
        raise
    sampler = Sampler(engine, backend.base_linear_weights, futures)
    return TinkerService(backend, sampler, CheckpointStore(Path(config.checkpoint_dir)),
                         SessionRegistry(config.session_timeout), futures,
                         Limits(config.max_sessions, config.max_adapters, config.max_queued_requests))


def create_app(config: ServerConfig, service: TinkerService | None = None) -> FastAPI:
    """The app; ``service`` is built from ``config`` when not given (tests pass their own)."""
    keys = config.tenant_keys()
    svc = service or build_service(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc.futures.bind_loop(asyncio.get_running_loop())
        svc.start()
        reaper = asyncio.create_task(_reap_forever(svc, min(10.0, config.session_timeout / 4)))
        try:
            yield
        finally:
            reaper.cancel()
            svc.stop()

    app = FastAPI(title="skyrl-tinker", lifespan=lifespan)
    app.state.service = svc

    # The last added runs first: the key is checked before any body is read, then the hygiene layer.
    limits = config.http_limits()
    app.add_middleware(HygieneMiddleware, limits=limits, bound_host=config.bound_host)
    app.add_middleware(_Authenticate, keys=keys, option="--api-key" if config.api_key is not None else "--api-keys")

    @app.exception_handler(HttpProblem)
    async def http_problem(_: Request, exc: HttpProblem) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(WireError)
    async def wire_error(_: Request, exc: WireError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # the client left before its body came (e.g. closing): nobody reads this

    @app.exception_handler(KeyError)
    async def missing_field(_: Request, exc: KeyError) -> JSONResponse:
        return JSONResponse({"detail": f"malformed request: missing field {exc.args[0]!r}"}, status_code=400)

    @app.exception_handler(ValueError)
    @app.exception_handler(TypeError)
    async def malformed(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"malformed request: {exc}"}, status_code=400)

    # --- service ---------------------------------------------------------------------------------

    @app.get(f"{API}/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(f"{API}/client/config")
    async def client_config() -> dict[str, Any]:
        return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": True,
                "parallel_fwdbwd_chunks": False, "fwdbwd_max_chunk_len": config.max_batch_datums,
                "sample_use_retrieve_futures": True, "custom_loss_server_side": False,
                "sample_join_sampling_session": False}

    @app.post(f"{API}/client/dynamic_config")
    async def client_dynamic_config() -> dict[str, Any]:
        return {"sample_cancel_enabled": True}  # an abandoned sample future is cancelled on the server

    @app.get(f"{API}/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return svc.capabilities()

    @app.post(f"{API}/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}  # the client reports its own telemetry; nothing is kept

    @app.post(f"{API}/create_session")
    async def create_session(request: Request, tenant: Tenant) -> dict[str, Any]:
        return svc.create_session(tenant, await _json(request))

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request, tenant: Tenant) -> dict[str, str]:
        svc.heartbeat(tenant, await _json(request))
        return {"type": "session_heartbeat"}

    @app.post(f"{API}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str, tenant: Tenant) -> None:
        svc.finish_session(tenant, session_id)

    # --- models and training ---------------------------------------------------------------------

    @app.post(f"{API}/create_model")
    async def create_model(request: Request, tenant: Tenant) -> dict[str, Any]:
        future, model_id = svc.create_model(tenant, await _json(request))
        return {"request_id": future.request_id, "model_id": model_id}

    @app.post(f"{API}/get_info")
    async def get_info(request: Request, tenant: Tenant) -> dict[str, Any]:
        return svc.get_info(tenant, await _json(request))

    @app.post(f"{API}/unload_model")
    async def unload_model(request: Request, tenant: Tenant) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.unload_model(tenant, body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request, tenant: Tenant) -> dict[str, Any]:
        parsed = await _forward_backward_body(request, forward_only=False, max_bytes=config.max_decompressed_bytes,
                                              limits=limits)
        return {"request_id": svc.forward_backward(tenant, parsed).request_id, "model_id": parsed.model_id}

    @app.post(f"{API}/forward")
    async def forward(request: Request, tenant: Tenant) -> dict[str, Any]:
        parsed = await _forward_backward_body(request, forward_only=True, max_bytes=config.max_decompressed_bytes,
                                              limits=limits)
        return {"request_id": svc.forward_backward(tenant, parsed).request_id, "model_id": parsed.model_id}

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request, tenant: Tenant) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.optim_step(tenant, body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request, tenant: Tenant) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.save_weights(tenant, body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request, tenant: Tenant) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.save_weights_for_sampler(tenant, body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request, tenant: Tenant) -> dict[str, Any]:
        return {"request_id": svc.load_weights(tenant, await _json(request)).request_id}

    # --- sampling --------------------------------------------------------------------------------

    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request, tenant: Tenant) -> dict[str, Any]:
        return svc.create_sampling_session(tenant, await _json(request))

    @app.get(f"{API}/samplers/{{sampling_id}}")
    async def sampler_info(sampling_id: str, tenant: Tenant) -> dict[str, Any]:
        return svc.sampler_info(tenant, sampling_id)

    @app.post(f"{API}/asample")
    async def asample(request: Request, tenant: Tenant) -> dict[str, Any]:
        future, sequence_ids = svc.asample(tenant, await _json(request))
        return {"request_id": future.request_id, "sample_sequence_ids": sequence_ids}

    # --- futures ---------------------------------------------------------------------------------

    @app.post(f"{API}/retrieve_futures")
    async def retrieve_futures(request: Request, tenant: Tenant) -> dict[str, Any]:
        return await svc.retrieve_futures(tenant, await _json(request), RETRIEVE_FUTURES_POLL_SECONDS)

    @app.post(f"{API}/cancel_future")
    async def cancel_future(request: Request, tenant: Tenant) -> dict[str, Any]:
        svc.cancel_future(tenant, await _json(request))
        return {}

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request, tenant: Tenant) -> Response:
        future = svc.future(tenant, Fields(await _json(request)).text("request_id"))
        if not await svc.futures.wait(future, POLL_SECONDS):
            return JSONResponse({"type": "try_again", "request_id": future.request_id, "queue_state": "active"})
        if future.error is not None:
            return JSONResponse({"error": future.error, "category": future.category})
        if isinstance(future.result, bytes):
            return Response(future.result, media_type="application/x-protobuf")
        return JSONResponse(future.result)

    # --- training runs and checkpoints -----------------------------------------------------------

    @app.get(f"{API}/training_runs")
    async def training_runs(tenant: Tenant, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        return svc.training_runs(tenant, max(limit, 0), max(offset, 0))

    @app.get(f"{API}/training_runs/{{run_id}}")
    async def training_run(run_id: str, tenant: Tenant) -> dict[str, Any]:
        return svc.training_run(tenant, run_id)

    @app.get(f"{API}/training_runs/{{run_id}}/checkpoints")
    async def list_checkpoints(run_id: str, tenant: Tenant) -> dict[str, Any]:
        return svc.list_checkpoints(tenant, run_id)

    # before the DELETE below, whose checkpoint_id:path would take ".../publish" too
    @app.api_route(f"{API}/training_runs/{{run_id}}/checkpoints/{{checkpoint_id:path}}/publish",
                   methods=["POST", "DELETE"])
    async def publish_checkpoint(request: Request, run_id: str, checkpoint_id: str, tenant: Tenant) -> None:
        svc.publish_checkpoint(tenant, run_id, checkpoint_id, public=request.method == "POST")

    @app.delete(f"{API}/training_runs/{{run_id}}/checkpoints/{{checkpoint_id:path}}")
    async def delete_checkpoint(run_id: str, checkpoint_id: str, tenant: Tenant) -> None:
        svc.delete_checkpoint(tenant, run_id, checkpoint_id)

    @app.post(f"{API}/weights_info")
    async def weights_info(request: Request, tenant: Tenant) -> dict[str, Any]:
        return svc.weights_info(tenant, await _json(request))

    # --- everything else -------------------------------------------------------------------------

    @app.api_route(f"{API}/{{rest:path}}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unsupported(rest: str) -> JSONResponse:
        feature = UNSUPPORTED.get(rest)
        what = f"{feature} ({API}/{rest})" if feature else f"the endpoint {API}/{rest}"
        return JSONResponse({"detail": f"skyrl-tinker does not implement {what}"}, status_code=404)

    return app


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise RequestError(400, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "body must be a JSON object")
    return body


class _Authenticate:
    """Names the tenant of every request by its ``X-API-Key`` (``request.state.tenant``), or answers 401."""

    def __init__(self, app: ASGIApp, keys: Mapping[str, str] | None, option: str) -> None:
        self.app, self.keys, self.option = app, keys, option

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tenant = tenant_of(self.keys, Headers(scope=scope).get("x-api-key"))
        if tenant is None:
            response = JSONResponse({"detail": f"missing or wrong API key (X-API-Key); the server was started "
                                               f"with {self.option}"}, status_code=401)
            return await response(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


async def _tenant(request: Request) -> str:  # async: a plain def would run in a thread pool, per request
    return request.state.tenant  # set by _Authenticate


Tenant = Annotated[str, Depends(_tenant)]


async def _forward_backward_body(request: Request, *, forward_only: bool, max_bytes: int,
                                 limits: HttpLimits) -> ForwardBackwardIn:
    raw = decompress(await request.body(), request.headers.get("content-encoding"), max_bytes)
    if "protobuf" in request.headers.get("content-type", ""):
        parsed = parse_forward_backward(raw)
        parsed.forward_only = parsed.forward_only or forward_only
        return parsed
    check_json_structure(raw, limits)  # what a zstd body decompressed to has not been checked yet
    try:
        body = Fields(json.loads(raw or b"{}"))
    except ValueError as exc:
        raise RequestError(400, f"body is neither protobuf (Content-Type) nor JSON: {exc}") from None
    fb = body.obj("forward_backward_input", required=True)
    data = []
    for i, raw_datum in enumerate(fb.items("data")):
        datum = Fields(raw_datum, f"forward_backward_input.data[{i}]")
        tokens = []
        for j, raw_chunk in enumerate(datum.obj("model_input").items("chunks")):
            chunk = Fields(raw_chunk, f"{datum.where}.model_input.chunks[{j}]")
            tokens += integers(chunk.items("tokens"), f"{chunk.where}.tokens")
        inputs = {k: tensor_from_json(v, f"datum {i} loss_fn_inputs[{k!r}]")
                  for k, v in datum.obj("loss_fn_inputs").data.items()}
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardIn(body.text("model_id"), body.integer("seq_id", None), data, fb.text("loss_fn"),
                             dict(fb.obj("loss_fn_config").data), forward_only)


async def _reap_forever(svc: TinkerService, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            svc.reap()
        except Exception:  # reaping must never stop; the next round tries again
            log.exception("reaping sessions failed")
