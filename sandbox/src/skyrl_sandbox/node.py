"""This machine as a node of a cluster: the env-worker slots it offers, and the sweep of what dead owners left.

A Ray node advertises one custom resource per installed sandbox backend that works on it and asks for one
(:attr:`SandboxBackend.ray_resource`; one slot per core), so env workers that need a backend are placed only
where it runs::

    ray start --address HEAD:6379 --resources "$(skyrl-sandbox doctor --ray-resources)"

A worker process that dies without cleaning up (SIGKILL, its node's raylet gone) leaves containers, host
folders and cgroups behind; :func:`sweep_orphans` removes those of every owner that is dead on this machine.
"""

from __future__ import annotations

import logging
import os

from .choice import strong_names
from .registry import get_backend, registered

log = logging.getLogger(__name__)


def node_resources(slots: int | None = None) -> dict[str, float]:
    """``{resource: slots}`` for each installed backend that offers a Ray resource and works here; ``slots``
    defaults to the core count."""
    count = float(slots if slots is not None else os.cpu_count() or 1)
    return {backend.ray_resource: count for backend in registered().values()
            if backend.ray_resource and backend.problem() is None}


def worker_resources(backend: str, auto: str | None = None) -> dict[str, float]:
    """The Ray resources of one env worker whose sandboxes use ``backend``: one slot of its resource (none for a
    backend that needs no special node). ``auto`` stands for the backend ``auto`` will pick on the workers' nodes
    (default: the first strong backend)."""
    chosen = backend if backend != "auto" else auto or strong_names()[0]
    resource = get_backend(chosen).ray_resource
    return {resource: 1.0} if resource else {}


def sweep_orphans() -> dict[str, int]:
    """Remove the sandbox folders, cgroups and containers of owners that died on this machine; counts by kind."""
    from .cgroups import sweep_stale_groups
    from .dirs import sweep_stale_dirs

    swept = {"folders": len(sweep_stale_dirs()), "cgroups": sweep_stale_groups()}
    for backend in registered().values():
        if backend.problem() is not None:
            continue
        try:
            counts = backend.sweep()
        except Exception as exc:  # noqa: BLE001 - an engine that went away must not stop the rest
            log.warning("could not sweep stale sandboxes of the %s backend: %s", backend.name, exc)
            continue
        for kind, count in counts.items():
            swept[kind] = swept.get(kind, 0) + count
    return swept
