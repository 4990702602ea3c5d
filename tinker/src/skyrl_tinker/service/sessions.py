"""Client sessions (:mod:`skyrl_tinker.routes.sessions`): opening one within the tenant's limit, its
heartbeats, and finishing it, which frees what it held."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_core.http_hygiene import shown

from skyrl_tinker.fields import Fields
from skyrl_tinker.service.state import DO_NOT_RETRY, RequestError, ServerState, check_limit


class SessionRequests:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def create_session(self, tenant: str, body: Mapping[str, Any]) -> dict[str, Any]:
        sessions = self.state.sessions
        check_limit(tenant, sessions.count(tenant), self.state.limits.sessions, "open sessions", "--max-sessions",
                    "close the ServiceClients you are done with (close()); silent ones are reaped after "
                    "--session-timeout", DO_NOT_RETRY)
        session = sessions.create(tenant, Fields(body).text("sdk_version", ""))
        return {"type": "create_session", "session_id": session.session_id}

    def heartbeat(self, tenant: str, body: Mapping[str, Any]) -> None:
        """410 for an unknown, finished, expired or foreign session alike (the client then stops its
        heartbeats)."""
        session_id = Fields(body).text("session_id")
        session = self.state.sessions.get(session_id)
        if session is None or session.tenant != tenant or not self.state.sessions.touch(session_id):
            raise RequestError(410, f"session {shown(session_id)} is unknown, finished or expired")

    def finish_session(self, tenant: str, session_id: str) -> None:
        self.state.session(tenant, session_id)
        session = self.state.sessions.finish(session_id)
        if session is not None:
            self.state.drop_session(session)
