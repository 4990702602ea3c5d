"""Client sessions: creating one, keeping it alive with heartbeats (the reaper drops silent ones), finishing it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from skyrl_tinker.routes.common import API, Sessions, Tenant, read_json

router = APIRouter(prefix=API)


@router.post("/create_session")
async def create_session(request: Request, tenant: Tenant, sessions: Sessions) -> dict[str, Any]:
    return sessions.create_session(tenant, await read_json(request))


@router.post("/session_heartbeat")
async def heartbeat(request: Request, tenant: Tenant, sessions: Sessions) -> dict[str, str]:
    sessions.heartbeat(tenant, await read_json(request))
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, tenant: Tenant, sessions: Sessions) -> None:
    sessions.finish_session(tenant, session_id)
