"""What ``skyrl --version`` prints: skyrl-core's version and every installed plugin distribution's.

A bug report needs all of them: an env's behaviour depends on its own package as much as on core.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any


def core_version() -> str:
    """The installed ``skyrl-core`` version (``unknown`` when running from an uninstalled source tree)."""
    try:
        return metadata.version("skyrl-core")
    except metadata.PackageNotFoundError:
        return "unknown"


def version_lines(plugin_manager: Any) -> list[str]:
    """``skyrl-core X (Python Y)``, one ``  <distribution> <version>`` line per plugin distribution, then
    the other installed ``skyrl-*`` distributions (libraries such as ``skyrl-sandbox``).

    A distribution that registers several plugins is listed once; one that failed to load says so
    (``skyrl plugins`` has its error).
    """
    lines = [f"skyrl-core {core_version()} (Python {platform.python_version()})"]
    seen: dict[tuple[str, str], bool] = {}
    for record in plugin_manager.records():
        key = (record.name, record.version or "unknown")
        seen[key] = seen.get(key, False) or record.error is not None
    if seen:
        lines.append("plugins:")
        for (name, version), failed in sorted(seen.items()):
            lines.append(f"  {name} {version}" + ("  (failed to load; see `skyrl plugins`)" if failed else ""))
    else:
        lines.append("no plugins installed")
    plugin_names = {_normalized(name) for name, _ in seen} | {"skyrl-core"}
    others = sorted({(dist.metadata["Name"], dist.version) for dist in metadata.distributions()
                     if dist.metadata["Name"] and _normalized(dist.metadata["Name"]).startswith("skyrl-")
                     and _normalized(dist.metadata["Name"]) not in plugin_names})
    if others:  # libraries such as skyrl-sandbox: no plugin, but part of the install
        lines.append("other skyrl packages:")
        lines.extend(f"  {name} {version}" for name, version in others)
    return lines


def installed_versions(plugin_manager: Any) -> dict[str, str]:
    """What :func:`version_lines` prints, by name, for a file: ``python``, ``skyrl-core``, each plugin
    distribution and each other installed ``skyrl-*`` distribution (``skyrl eval`` keeps it in eval.json)."""
    versions = {"python": platform.python_version(), "skyrl-core": core_version()}
    for record in plugin_manager.records():
        versions.setdefault(record.name, record.version or "unknown")
    known = {_normalized(name) for name in versions}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and _normalized(name).startswith("skyrl-") and _normalized(name) not in known:
            versions[name] = dist.version
            known.add(_normalized(name))
    return versions


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
