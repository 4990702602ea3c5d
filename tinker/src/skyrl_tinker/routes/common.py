"""What every route module shares: the ``/api/v1`` prefix, the JSON body reader, and the dependencies that
hand a route its tenant, the service (or the handler of the route's resource on it) and the server's config
(all put in place by :func:`skyrl_tinker.app.create_app`: the tenant by its authentication middleware, the
others on ``app.state``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Depends, Request
from skyrl_core.http_hygiene import JSON_TYPES, load_json

from skyrl_tinker.config import ServerConfig
from skyrl_tinker.service import TinkerService
from skyrl_tinker.service.checkpoints import CheckpointRequests
from skyrl_tinker.service.futures import FutureRequests
from skyrl_tinker.service.sampling import SamplingRequests
from skyrl_tinker.service.sessions import SessionRequests
from skyrl_tinker.service.state import RequestError
from skyrl_tinker.service.training import TrainingRequests
from skyrl_tinker.wire import decompress

API = "/api/v1"


# all async: a plain def would run in a thread pool, per request
async def _tenant(request: Request) -> str:
    return request.state.tenant  # set by skyrl_tinker.app's _Authenticate


async def _service(request: Request) -> TinkerService:
    return request.app.state.service


async def _config(request: Request) -> ServerConfig:
    return request.app.state.config


def _handler(attribute: str) -> Any:
    """The dependency that hands a route ``TinkerService.<attribute>``, the handler of its resource."""

    async def handler(request: Request) -> Any:
        return getattr(request.app.state.service, attribute)

    return Depends(handler)


Tenant = Annotated[str, Depends(_tenant)]
Service = Annotated[TinkerService, Depends(_service)]
Config = Annotated[ServerConfig, Depends(_config)]
Sessions = Annotated[SessionRequests, _handler("session_requests")]
Training = Annotated[TrainingRequests, _handler("training_requests")]
Sampling = Annotated[SamplingRequests, _handler("sampling_requests")]
Futures = Annotated[FutureRequests, _handler("future_requests")]
Checkpoints = Annotated[CheckpointRequests, _handler("checkpoint_requests")]


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object (an empty body is ``{}``), or a 4xx.

    Whatever reached the route is checked here as JSON, after its ``Content-Encoding`` is undone: a body
    labelled protobuf (only forward_backward takes one) is a 415, and a zstd body may expand only to what an
    uncompressed one could be, then passes core's depth, value-count and surrogate checks like any other."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type not in JSON_TYPES:
        raise RequestError(415, "this endpoint takes a JSON body (Content-Type: application/json)")
    limits = request.app.state.config.http_limits()
    raw = await request.body()
    if request.headers.get("content-encoding"):
        raw = await asyncio.to_thread(decompress, raw, request.headers["content-encoding"], limits.max_body_bytes)
    body = await load_json(raw or b"{}", limits)
    if not isinstance(body, dict):
        raise RequestError(400, "body must be a JSON object")
    return body
