"""What every route module shares: the ``/api/v1`` prefix, the JSON body reader, and the dependencies that
hand a route its tenant, the service and the server's config (all three put in place by
:func:`skyrl_tinker.app.create_app`: the tenant by its authentication middleware, the others on ``app.state``)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import Depends, Request
from skyrl_core.http_hygiene import JSON_TYPES, load_json

from skyrl_tinker.config import ServerConfig
from skyrl_tinker.service import RequestError, TinkerService
from skyrl_tinker.wire import decompress

API = "/api/v1"


# all async: a plain def would run in a thread pool, per request
async def _tenant(request: Request) -> str:
    return request.state.tenant  # set by skyrl_tinker.app's _Authenticate


async def _service(request: Request) -> TinkerService:
    return request.app.state.service


async def _config(request: Request) -> ServerConfig:
    return request.app.state.config


Tenant = Annotated[str, Depends(_tenant)]
Service = Annotated[TinkerService, Depends(_service)]
Config = Annotated[ServerConfig, Depends(_config)]


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
