"""How our ASGI servers run under uvicorn: with the one limit :mod:`skyrl_core.http_hygiene` cannot apply,
because it sees a request only once the request's head has arrived.

A connection that has not sent a whole request head within ``HEAD_TIMEOUT_S`` of being ready for one
(just opened, or done with its last request) is closed. Without it, uvicorn waits for a half-sent
head forever, so a stranger's script that opens connections and sends a few bytes each (slowloris)
holds them until the server has no file descriptors left and answers nobody. A body that stalls is
the hygiene layer's to refuse (``HttpLimits.body_idle_s``).

Needs uvicorn (every server that uses this depends on it; importing :mod:`skyrl_core` does not).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 30.0


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request head is not in within ``head_timeout_s``."""

    head_timeout_s = HEAD_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:  # a request's head is in
            self._disarm()

    def on_response_complete(self) -> None:
        self._await_head()  # first: a pipelined request that the call below starts disarms it
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """``uvicorn.Config(app, **options)`` serving HTTP/1.1 with :class:`HeadDeadlineProtocol`."""
    return uvicorn.Config(app, http=HeadDeadlineProtocol, **options)
