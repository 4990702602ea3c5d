"""The HTTP surface: FastAPI routes for the ``/api/v1`` endpoints the ``tinker`` client calls.

Routes only parse bodies and shape responses; :mod:`skyrl_tinker.service` does the work. Queued work
answers at once with ``{"request_id": ...}`` and the client polls ``retrieve_future``. Errors are
JSON ``{"detail": "..."}`` with a 4xx status. Endpoints the client knows but this server does not
implement answer 404 naming the feature (not 501: the client retries every 5xx for minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from skyrl_tinker.backend import Backend
from skyrl_tinker.checkpoints import CheckpointStore
from skyrl_tinker.futures import FutureStore
from skyrl_tinker.sampler import Sampler, SamplerEngineKind, SamplingEngine, build_sampler_engine
from skyrl_tinker.service import MAX_TOPK, RequestError, TinkerService
from skyrl_tinker.sessions import SessionRegistry
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
    api_key: str | None = None  # when set, every request must carry it as X-API-Key
    # hf: transformers on ``device``; vllm: vLLM on the first visible GPU (needs skyrl-trainers[vllm] and CUDA)
    sampler_engine: SamplerEngineKind = "hf"
    sampler_gpu_memory_utilization: float = 0.4  # vllm only: the share of the GPU vLLM reserves (rest: trainer)


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
                         SessionRegistry(config.session_timeout), futures)


def create_app(config: ServerConfig, service: TinkerService | None = None) -> FastAPI:
    """The app; ``service`` is built from ``config`` when not given (tests pass their own)."""
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

    if config.api_key is not None:
        @app.middleware("http")
        async def check_api_key(request: Request, call_next: Any) -> Response:
            if request.headers.get("x-api-key") != config.api_key:
                return JSONResponse({"detail": "missing or wrong API key (X-API-Key); the server was started "
                                               "with --api-key"}, status_code=401)
            return await call_next(request)

    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(WireError)
    async def wire_error(_: Request, exc: WireError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

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
    async def create_session(request: Request) -> dict[str, Any]:
        body = await _json(request)
        session = svc.sessions.create(str(body.get("sdk_version", "")))
        return {"type": "create_session", "session_id": session.session_id}

    @app.post(f"{API}/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, str]:
        body = await _json(request)
        if not svc.sessions.touch(body["session_id"]):
            raise RequestError(410, f"session {body['session_id']!r} is unknown, finished or expired")
        return {"type": "session_heartbeat"}

    @app.post(f"{API}/sessions/{{session_id}}/finish")
    async def finish_session(session_id: str) -> None:
        session = svc.sessions.finish(session_id)
        if session is not None:
            svc.drop_session(session)

    # --- models and training ---------------------------------------------------------------------

    @app.post(f"{API}/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        future, model_id = svc.create_model(await _json(request))
        return {"request_id": future.request_id, "model_id": model_id}

    @app.post(f"{API}/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return svc.get_info((await _json(request))["model_id"])

    @app.post(f"{API}/unload_model")
    async def unload_model(request: Request) -> dict[str, Any]:
        model_id = (await _json(request))["model_id"]
        return {"request_id": svc.unload_model(model_id).request_id, "model_id": model_id}

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        parsed = await _forward_backward_body(request, forward_only=False)
        return {"request_id": svc.forward_backward(parsed).request_id, "model_id": parsed.model_id}

    @app.post(f"{API}/forward")
    async def forward(request: Request) -> dict[str, Any]:
        parsed = await _forward_backward_body(request, forward_only=True)
        return {"request_id": svc.forward_backward(parsed).request_id, "model_id": parsed.model_id}

    @app.post(f"{API}/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.optim_step(body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.save_weights(body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/save_weights_for_sampler")
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        body = await _json(request)
        return {"request_id": svc.save_weights_for_sampler(body).request_id, "model_id": body["model_id"]}

    @app.post(f"{API}/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        return {"request_id": svc.load_weights(await _json(request)).request_id}

    # --- sampling --------------------------------------------------------------------------------

    @app.post(f"{API}/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        return svc.create_sampling_session(await _json(request))

    @app.get(f"{API}/samplers/{{sampling_id}}")
    async def sampler_info(sampling_id: str) -> dict[str, Any]:
        return svc.sampler_info(sampling_id)

    @app.post(f"{API}/asample")
    async def asample(request: Request) -> dict[str, Any]:
        future, sequence_ids = svc.asample(await _json(request))
        return {"request_id": future.request_id, "sample_sequence_ids": sequence_ids}

    # --- futures ---------------------------------------------------------------------------------

    @app.post(f"{API}/retrieve_futures")
    async def retrieve_futures(request: Request) -> dict[str, Any]:
        return await svc.retrieve_futures(await _json(request), RETRIEVE_FUTURES_POLL_SECONDS)

    @app.post(f"{API}/cancel_future")
    async def cancel_future(request: Request) -> dict[str, Any]:
        svc.cancel_future(await _json(request))
        return {}

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        request_id = (await _json(request))["request_id"]
        future = svc.futures.get(request_id)
        if future is None:
            raise RequestError(404, f"unknown request id {request_id!r} (never issued, or its session was reaped)")
        if not await svc.futures.wait(future, POLL_SECONDS):
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if future.error is not None:
            return JSONResponse({"error": future.error, "category": future.category})
        if isinstance(future.result, bytes):
            return Response(future.result, media_type="application/x-protobuf")
        return JSONResponse(future.result)

    # --- training runs and checkpoints -----------------------------------------------------------

    @app.get(f"{API}/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        return svc.training_runs(limit, offset)

    @app.get(f"{API}/training_runs/{{run_id}}")
    async def training_run(run_id: str) -> dict[str, Any]:
        return svc.training_run(run_id)

    @app.get(f"{API}/training_runs/{{run_id}}/checkpoints")
    async def list_checkpoints(run_id: str) -> dict[str, Any]:
        return svc.list_checkpoints(run_id)

    @app.delete(f"{API}/training_runs/{{run_id}}/checkpoints/{{checkpoint_id:path}}")
    async def delete_checkpoint(run_id: str, checkpoint_id: str) -> None:
        svc.delete_checkpoint(run_id, checkpoint_id)

    @app.post(f"{API}/weights_info")
    async def weights_info(request: Request) -> dict[str, Any]:
        return svc.weights_info((await _json(request))["tinker_path"])

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


async def _forward_backward_body(request: Request, *, forward_only: bool) -> ForwardBackwardIn:
    raw = decompress(await request.body(), request.headers.get("content-encoding"))
    if "protobuf" in request.headers.get("content-type", ""):
        parsed = parse_forward_backward(raw)
        parsed.forward_only = parsed.forward_only or forward_only
        return parsed
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise RequestError(400, f"body is neither protobuf (Content-Type) nor JSON: {exc}") from None
    fb = body["forward_backward_input"]
    data = []
    for i, datum in enumerate(fb["data"]):
        tokens = [int(t) for chunk in datum["model_input"]["chunks"] for t in chunk["tokens"]]
        inputs = {k: tensor_from_json(v, f"datum {i} loss_fn_inputs[{k!r}]")
                  for k, v in datum.get("loss_fn_inputs", {}).items()}
        data.append(DatumIn(tokens, inputs))
    return ForwardBackwardIn(body["model_id"], body.get("seq_id"), data, fb["loss_fn"],
                             dict(fb.get("loss_fn_config") or {}), forward_only)


async def _reap_forever(svc: TinkerService, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            svc.reap()
        except Exception:  # reaping must never stop; the next round tries again
            log.exception("reaping sessions failed")
