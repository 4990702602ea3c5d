"""The ``/api/v1`` routes: one :class:`~fastapi.APIRouter` (prefixed ``/api/v1``) per resource module.

Routes only parse bodies and shape responses; :mod:`skyrl_tinker.service` does the work. ``ROUTERS`` is the
order the app includes them in: first match wins, so the catch-all of :mod:`~skyrl_tinker.routes.unsupported`
comes last.
"""

from __future__ import annotations

from fastapi import APIRouter

from skyrl_tinker.routes import checkpoints, futures, sampling, server, sessions, training, unsupported

ROUTERS: tuple[APIRouter, ...] = (server.router, sessions.router, training.router, sampling.router, futures.router,
                                  checkpoints.router, unsupported.router)
