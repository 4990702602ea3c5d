"""This machine as a node of a cluster: the env-worker slots it offers, and the sweep of what dead owners left.

A Ray node advertises one custom resource per sandbox backend that works on it (``{"bwrap": 8, "docker":
8}``: one slot per core), so env workers that need a backend are placed only where it runs::

    ray start --address HEAD:6379 --resources "$(skyrl-sandbox doctor --ray-resources)"

A worker process that dies without cleaning up (SIGKILL, its node's raylet gone) leaves containers, host
folders and cgroups behind; :func:`sweep_orphans` removes those of every owner that is dead on this machine.
"""

from __future__ import annotations

import logging
import os

from .backends import STRONG, backend_problem

log = logging.getLogger(__name__)


def node_resources(slots: int | None = None) -> dict[str, float]:
    """``{backend: slots}`` for each strong backend that works here; ``slots`` defaults to the core count."""
    count = float(slots if slots is not None else os.cpu_count() or 1)
    return {backend: count for backend in STRONG if backend_problem(backend) is None}


def worker_resources(backend: str, auto: str = "bwrap") -> dict[str, float]:
    """The Ray resources of one env worker whose sandboxes use ``backend`` (``auto`` counting as ``auto``):
    one slot of that backend, none for the unisolated ``subprocess`` backend."""
    chosen = auto if backend == "auto" else backend
    return {chosen: 1.0} if chosen in STRONG else {}


def sweep_orphans() -> dict[str, int]:
    """Remove the sandbox folders, cgroups and containers of owners that died on this machine; counts by kind."""
    from .cgroups import sweep_stale_groups
    from .dirs import sweep_stale_dirs

    swept = {"folders": len(sweep_stale_dirs()), "cgroups": sweep_stale_groups(), "containers": 0}
    if backend_problem("docker") is None:
        from .docker_engine import sweep_stale_containers

        try:
            swept["containers"] = len(sweep_stale_containers())
        except Exception as exc:  # noqa: BLE001 - an engine that went away must not stop the rest
            log.warning("could not sweep stale sandbox containers: %s", exc)
    return swept
