"""Joining Ray for a run, or starting a local one, before any component needs it.

Everything a run places on Ray (env workers, engine replicas, trainer ranks) uses the one Ray instance
this module connects: ``run.ray_address`` joins a cluster (``auto``: the one ``ray start`` runs on this
machine; ``ray://HOST:10001`` through Ray Client), and without it a run that needs Ray starts a local
instance whose node advertises this machine's :func:`~skyrl_core.nodes.node_resources`.
"""

from __future__ import annotations

import gc
import logging
import os
from types import ModuleType
from typing import Any

from skyrl_core.factory import ConfigError

log = logging.getLogger(__name__)


def require_ray(what: str) -> ModuleType:
    """The ``ray`` module, or a :class:`ConfigError` saying that ``what`` needs it and how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{what} needs Ray: pip install 'skyrl-core[ray]'") from None
    return ray


def connect(address: str | None = None, *, what: str = "Ray placement", num_cpus: int | None = None) -> bool:
    """Join the cluster at ``address`` or start a local Ray (of ``num_cpus``, default this machine's, at
    least 2); ``True`` when this call started it (the caller shuts it down with :func:`disconnect`). A Ray
    already initialised in this process is kept."""
    ray = require_ray(what)
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        log.info("joined the Ray cluster at %s", address)
        return True
    from skyrl_core.nodes import node_resources

    resources = node_resources()
    ray.init(num_cpus=num_cpus or max(os.cpu_count() or 1, 2), resources=resources, include_dashboard=False,
             log_to_driver=True)
    log.info("started a local Ray; this node offers env workers %s", resources or "no custom resources")
    return True


def disconnect(owned: bool) -> None:
    """Shut Ray down if :func:`connect` started or joined it for this run (or whoever owns it says so).

    Garbage is collected first: an actor handle or object ref freed after ``ray.shutdown`` (a reference
    cycle, say a failed task's traceback, that a later collection frees in any thread) makes Ray end the
    whole process ("the core worker has already been shutdown").
    """
    if owned:
        import ray

        gc.collect()
        ray.shutdown()


def run_needs_ray(config: Any) -> bool:
    """Whether a resolved run config places anything on Ray through core (``run.ray_address`` or
    ``generator.env_placement=ray``); trainers' own Ray options join the same instance."""
    return bool(getattr(config.run, "ray_address", None)) or getattr(config.generator, "env_placement", "local") == "ray"


def connect_for_run(config: Any) -> bool:
    """:func:`connect` when :func:`run_needs_ray`; ``True`` when the caller must :func:`disconnect`."""
    if not run_needs_ray(config):
        return False
    return connect(getattr(config.run, "ray_address", None), what="generator.env_placement=ray")
