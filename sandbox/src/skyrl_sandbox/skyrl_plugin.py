"""skyrl-sandbox's hooks for ``skyrl-core``'s plugin loader (entry point group ``skyrl``).

Only core's loader imports this module, so it runs only where ``skyrl-core`` is installed; the rest of the
package never imports core.
"""

from __future__ import annotations

from skyrl_core import hookimpl

from .node import node_resources as _node_resources
from .node import sweep_orphans as _sweep_orphans
from .registry import GROUP


@hookimpl
def entry_point_groups() -> list[str]:
    return [GROUP]  # sandbox backends of other packages: listed by `skyrl plugins`


@hookimpl
def node_resources() -> dict[str, float]:
    return _node_resources()


@hookimpl
def sweep_orphans() -> dict[str, int]:
    return _sweep_orphans()
