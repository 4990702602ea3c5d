"""This machine as a node of a Ray cluster: the resources it offers env workers, and the orphan sweep.

Both ask the installed plugins (hooks :func:`~skyrl_core.hookspecs.node_resources` and
:func:`~skyrl_core.hookspecs.sweep_orphans`); a plugin whose hook raises is logged and skipped, so one
broken plugin never stops a node from advertising or sweeping the rest.
"""

from __future__ import annotations

import logging
from typing import Any

from skyrl_core.plugins import PluginManager, get_plugin_manager

log = logging.getLogger(__name__)


def _results(pm: PluginManager, hook: str) -> list[tuple[str, Any]]:
    out = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        name = pm.provider_of(impl.plugin).name
        try:
            result = impl.function()
        except Exception as exc:  # noqa: BLE001 - reported, the other plugins still answer
            log.warning("plugin %s: its %s hook raised %s: %s", name, hook, type(exc).__name__, exc)
            continue
        if result:
            out.append((name, result))
    return out


def node_resources(pm: PluginManager | None = None) -> dict[str, float]:
    """The custom Ray resources of this machine, merged over plugins (the larger amount wins)."""
    merged: dict[str, float] = {}
    for _, resources in _results(pm or get_plugin_manager(), "node_resources"):
        for key, amount in dict(resources).items():
            merged[str(key)] = max(float(amount), merged.get(str(key), 0.0))
    return merged


def sweep_orphans(pm: PluginManager | None = None) -> dict[str, int]:
    """Run every plugin's orphan sweep on this machine; what each removed, as ``{"<plugin>/<kind>": n}``."""
    swept: dict[str, int] = {}
    for name, counts in _results(pm or get_plugin_manager(), "sweep_orphans"):
        for kind, count in dict(counts).items():
            swept[f"{name}/{kind}"] = swept.get(f"{name}/{kind}", 0) + int(count)
    return swept
