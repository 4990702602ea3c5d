"""The installed sandbox backends, found through the entry-point group ``skyrl_sandbox.backends``.

skyrl-sandbox registers its own three (bwrap, docker, subprocess) the same way a third party registers
one, so nothing here names a backend. A backend that fails to load, or whose object does not fulfil
:class:`~skyrl_sandbox.backend.SandboxBackend`, is left out with a warning naming its distribution.
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import entry_points

from .backend import SandboxBackend
from .errors import SandboxError

GROUP = "skyrl_sandbox.backends"
log = logging.getLogger(__name__)


@functools.cache
def registered() -> dict[str, SandboxBackend]:
    """Every installed backend by name: strong ones first (in ``auto`` order), then the rest by name."""
    found: dict[str, SandboxBackend] = {}
    for point in entry_points(group=GROUP):
        origin = f"entry point {point.name!r} of {point.dist.name if point.dist else 'an unknown distribution'}"
        try:
            backend = point.load()
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
            log.warning("sandbox backend %s failed to load: %s: %s", origin, type(exc).__name__, exc)
            continue
        if not isinstance(backend, SandboxBackend):
            log.warning("sandbox backend %s is not a SandboxBackend (%r); left out", origin, backend)
        elif backend.name != point.name:
            log.warning("sandbox backend %s calls itself %r; left out", origin, backend.name)
        elif backend.name in found:
            log.warning("sandbox backend %s: %r is registered twice; the first stays", origin, backend.name)
        else:
            found[backend.name] = backend
    ordered = sorted(found.values(), key=lambda b: (not b.strong, b.auto_rank if b.strong else 0, b.name))
    return {backend.name: backend for backend in ordered}


def backend_names() -> tuple[str, ...]:
    return tuple(registered())


def get_backend(name: str) -> SandboxBackend:
    """The backend called ``name``; SandboxError listing the installed ones when there is none."""
    try:
        return registered()[name]
    except KeyError:
        raise SandboxError(f"unknown sandbox backend {name!r}; installed: {', '.join(registered()) or 'none'} "
                           f"(backends register in the entry-point group {GROUP})") from None
