"""The HTTP app: FastAPI serving the ``/api/v1`` endpoints the ``tinker`` client calls.

:func:`create_app` builds it from a :class:`~skyrl_tinker.config.ServerConfig`: middleware, error handlers and
the routers of :mod:`skyrl_tinker.routes` (one per resource). Queued work answers at once with
``{"request_id": ...}`` and the client polls ``retrieve_future``. Errors are JSON ``{"detail": "..."}`` with a
4xx status. Endpoints the client knows but this server does not implement answer 404 naming the feature.
Every request is authenticated to a tenant first (:mod:`skyrl_tinker.tenants`); routes hand it on.
Then core's HTTP hygiene (:mod:`skyrl_core.http_hygiene`) checks it before a route reads it: the
``Host`` (421 for names other than loopback, the bound address and ``allowed_hosts``: a page that
rebinds its name cannot drive the API through a browser), a web page's ``Origin`` or
``Sec-Fetch-Site`` (403: no page may change state), the body size (413 above ``max_body_mb``), its
content type (415 unless JSON or protobuf, a body-less POST included: no cross-site ``text/plain``,
form or empty posts), its encoding (415 unless zstd or none) and a JSON body's nesting and value
count (400). Routes parse every JSON body through core's ``parse_json`` after undoing its encoding,
so a body whose label skipped the early check is checked there. Every error body is core's, its
message cut to a bounded length; messages quote request values through ``shown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from skyrl_core.http_hygiene import HttpProblem, HygieneMiddleware, error_body, shown, validation_detail
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from skyrl_tinker.backend import Backend
from skyrl_tinker.checkpoints import CheckpointStore
from skyrl_tinker.config import ServerConfig
from skyrl_tinker.futures import FutureStore
from skyrl_tinker.routes import ROUTERS
from skyrl_tinker.sampler import Sampler, SamplingEngine, build_sampler_engine
from skyrl_tinker.seeds import ServerSeeds
from skyrl_tinker.service import TinkerService
from skyrl_tinker.service.sampling import MAX_TOPK
from skyrl_tinker.service.state import RequestError
from skyrl_tinker.sessions import SessionRegistry
from skyrl_tinker.tenants import tenant_of
from skyrl_tinker.wire import WireError

log = logging.getLogger(__name__)


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
                         config.limits(),
                         None if config.seed is None else ServerSeeds(config.seed))


def create_app(config: ServerConfig, service: TinkerService | None = None) -> FastAPI:
    """The app; ``service`` is built from ``config`` when not given (tests pass their own).
    Routes reach both through ``app.state`` (:mod:`skyrl_tinker.routes.common`)."""
    keys = config.tenant_keys()
    svc = service or build_service(config)
    app = FastAPI(title="skyrl-tinker", lifespan=_lifespan)
    app.state.service = svc
    app.state.config = config
    # The last added runs first: the key is checked before any body is read, then the hygiene layer.
    app.add_middleware(HygieneMiddleware, limits=config.http_limits(), bound_host=config.bound_host)
    app.add_middleware(_Authenticate, keys=keys, option="--api-key" if config.api_key is not None else "--api-keys")
    for exc_type, handler in _ERROR_HANDLERS.items():
        app.add_exception_handler(exc_type, handler)
    for router in ROUTERS:
        app.include_router(router)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    svc: TinkerService = app.state.service
    svc.futures.bind_loop(asyncio.get_running_loop())
    svc.start()
    reaper = asyncio.create_task(_reap_forever(svc, min(10.0, app.state.config.session_timeout / 4)))
    try:
        yield
    finally:
        reaper.cancel()
        svc.stop()


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """Every error this app sends: core's ``{"detail": message}`` body, the message cut to its limit."""
    return Response(error_body(message), status_code=status, headers=headers, media_type="application/json")


async def _http_problem(_: Request, exc: HttpProblem) -> Response:
    return _error(exc.status, exc.message, exc.headers)


async def _request_error(_: Request, exc: RequestError) -> Response:
    return _error(exc.status, exc.message, exc.headers)


async def _wire_error(_: Request, exc: WireError) -> Response:
    return _error(exc.status, str(exc))


async def _invalid_parameters(_: Request, exc: RequestValidationError) -> Response:
    return _error(422, validation_detail(exc.errors()))  # names the parameter, never its value


async def _client_gone(_: Request, exc: ClientDisconnect) -> Response:
    return Response(status_code=400)  # the client left before its body came (e.g. closing): nobody reads this


async def _missing_field(_: Request, exc: KeyError) -> Response:
    return _error(400, f"malformed request: missing field {shown(exc.args[0] if exc.args else '')}")


async def _malformed(_: Request, exc: Exception) -> Response:
    return _error(400, f"malformed request: {exc}")


_ERROR_HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[Response]]] = {
    HttpProblem: _http_problem, RequestError: _request_error, WireError: _wire_error, ClientDisconnect: _client_gone,
    RequestValidationError: _invalid_parameters, KeyError: _missing_field, ValueError: _malformed,
    TypeError: _malformed,
}


class _Authenticate:
    """Names the tenant of every request by its ``X-API-Key`` (``request.state.tenant``), or answers 401."""

    def __init__(self, app: ASGIApp, keys: Mapping[str, str] | None, option: str) -> None:
        self.app, self.keys, self.option = app, keys, option

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tenant = tenant_of(self.keys, Headers(scope=scope).get("x-api-key"))
        if tenant is None:
            response = _error(401, f"missing or wrong API key (X-API-Key); the server was started with {self.option}")
            return await response(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


async def _reap_forever(svc: TinkerService, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            svc.reap()
        except Exception:  # reaping must never stop; the next round tries again
            log.exception("reaping sessions failed")
