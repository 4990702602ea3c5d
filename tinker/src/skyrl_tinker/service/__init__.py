"""What each Tinker request does: ownership and validation, then work queued on the training worker or
the sampler.

HTTP-free, and split by resource as :mod:`skyrl_tinker.routes` is: each route module calls the handler of
its resource (:mod:`~skyrl_tinker.service.sessions`, :mod:`~skyrl_tinker.service.training`,
:mod:`~skyrl_tinker.service.sampling`, :mod:`~skyrl_tinker.service.futures`,
:mod:`~skyrl_tinker.service.checkpoints`), and all of them act on one
:class:`~skyrl_tinker.service.state.ServerState` (whose docstring says what a tenant may see and hold).
Every handler method returns a JSON-ready dict, returns a :class:`~skyrl_tinker.futures.Future` for queued
work, or raises :class:`~skyrl_tinker.service.state.RequestError` with an HTTP status and a message naming
what was wrong.
"""

from __future__ import annotations

import logging
from typing import Any

from skyrl_tinker.service.checkpoints import CheckpointRequests
from skyrl_tinker.service.futures import FutureRequests
from skyrl_tinker.service.sampling import SamplingRequests
from skyrl_tinker.service.sessions import SessionRequests
from skyrl_tinker.service.state import ServerState
from skyrl_tinker.service.training import TrainingRequests

log = logging.getLogger(__name__)

FUTURE_TTL = 3600.0  # seconds a finished result stays retrievable


class TinkerService(ServerState):
    """The server: its shared state, one handler per resource built on it, and what the app's lifespan runs
    (start, stop, and reaping silent sessions)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session_requests = SessionRequests(self)
        self.training_requests = TrainingRequests(self)
        self.sampling_requests = SamplingRequests(self)
        self.future_requests = FutureRequests(self)
        self.checkpoint_requests = CheckpointRequests(self)

    def start(self) -> None:
        self.worker.start()
        self.sampler.start()

    def stop(self) -> None:
        self.worker.stop()
        self.sampler.stop()

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": self.backend.base_model_name,
                                      "max_context_length": self.backend.max_context,
                                      "trainable": True, "sampleable": True}]}

    def reap(self) -> int:
        """Drop silent sessions (and finished futures older than ``FUTURE_TTL``); returns sessions reaped."""
        self.futures.prune(FUTURE_TTL)
        gone = self.sessions.expired()
        for session in gone:
            log.info("session %s stopped sending heartbeats; reaped", session.session_id)
            self.drop_session(session)
        return len(gone)
