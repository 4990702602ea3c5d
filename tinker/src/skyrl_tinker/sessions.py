"""Client sessions: created by every ``ServiceClient``, kept alive by its heartbeat (every 10 s).

A session whose heartbeat stops for ``timeout`` seconds is reaped: its training models (adapters and
optimizer state), sampling sessions and futures are dropped. Checkpoints on disk stay. A session
belongs to the tenant that created it (the service checks that before using one).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Session:
    session_id: str
    tenant: str
    sdk_version: str
    last_seen: float = field(default_factory=time.monotonic)
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)
    finished: bool = False


class SessionRegistry:
    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = timeout
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, tenant: str, sdk_version: str) -> Session:
        session = Session(f"s-{secrets.token_hex(16)}", tenant, sdk_version)
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def count(self, tenant: str) -> int:
        with self._lock:
            return sum(s.tenant == tenant for s in self._sessions.values())

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._sessions.get(session_id)

    def touch(self, session_id: str) -> bool:
        """Record a heartbeat; False when the session is unknown, reaped or finished."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or session.finished:
                return False
            session.last_seen = time.monotonic()
            return True

    def finish(self, session_id: str) -> Session | None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            session.finished = True
        return session

    def expired(self, now: float | None = None) -> list[Session]:
        """Remove and return the sessions whose last heartbeat is older than ``timeout``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [s for s in self._sessions.values() if now - s.last_seen > self.timeout]
            for session in gone:
                del self._sessions[session.session_id]
        return gone

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
