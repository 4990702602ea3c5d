"""What every route module shares: the ``/api/v1`` prefix, the JSON body reader, and the dependencies that
hand a route its tenant, the service and the server's config (all three put in place by
:func:`skyrl_tinker.app.create_app`: the tenant by its authentication middleware, the others on ``app.state``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, Request

from skyrl_tinker.config import ServerConfig
from skyrl_tinker.service import RequestError, TinkerService

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
    """The body as a JSON object (an empty body is ``{}``), or a 400."""
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise RequestError(400, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "body must be a JSON object")
    return body
