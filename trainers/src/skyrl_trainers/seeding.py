"""Whether a generator takes the per-request seeds of :func:`skyrl_core.generator.request_seed`, asked by the
training loop and by held-out evaluation alike."""

from __future__ import annotations

import inspect
from typing import Any


def accepts_seed(generator: Any) -> bool:
    """Whether ``generator.generate`` takes a ``seed`` keyword (by name or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(generator.generate).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == "seed" and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD for p in parameters)
