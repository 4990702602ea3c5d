"""Futures of queued work: long-polling one (``retrieve_future``) or several for their results, and cancelling one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from skyrl_tinker.routes.common import API, Futures, Tenant, read_json

RETRIEVE_FUTURES_POLL_SECONDS = 30.0  # the client's poller allows a retrieve_futures call 45 s
POLL_SECONDS = 40.0  # a retrieve_future long-poll (the client times out at 45 s and logs every try_again)

router = APIRouter(prefix=API)


@router.post("/retrieve_futures")
async def retrieve_futures(request: Request, tenant: Tenant, futures: Futures) -> dict[str, Any]:
    return await futures.retrieve_futures(tenant, await read_json(request), RETRIEVE_FUTURES_POLL_SECONDS)


@router.post("/cancel_future")
async def cancel_future(request: Request, tenant: Tenant, futures: Futures) -> dict[str, Any]:
    futures.cancel_future(tenant, await read_json(request))
    return {}


# the result (JSON, or protobuf bytes), the error, or try_again when it is not done within the poll
# (a comment, not a docstring: FastAPI would publish a docstring in the OpenAPI schema)
@router.post("/retrieve_future")
async def retrieve_future(request: Request, tenant: Tenant, futures: Futures) -> Response:
    future, settled = await futures.retrieve_future(tenant, await read_json(request), POLL_SECONDS)
    if not settled:
        return JSONResponse({"type": "try_again", "request_id": future.request_id, "queue_state": "active"})
    if future.error is not None:
        return JSONResponse({"error": future.error, "category": future.category})
    if isinstance(future.result, bytes):
        return Response(future.result, media_type="application/x-protobuf")
    return JSONResponse(future.result)
