"""The choice of backend for a sandbox: a name, or ``auto``, checked against what is installed and works here.

``auto`` is the first strong backend (see :attr:`SandboxBackend.strong`, in ``auto_rank`` order) that works
here among those the caller can use, else an error that says what is missing; a weak backend is never
chosen unless asked for by name, and warns once when it is. ``SKYRL_SANDBOX=<name>`` requires one backend
for every sandbox of a run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from .errors import BackendUnavailable, SandboxError
from .registry import backend_names, get_backend, registered

log = logging.getLogger(__name__)

REQUIRE_ENV = "SKYRL_SANDBOX"
_warned_weak: set[str] = set()


def backend_problem(backend: str) -> str | None:
    """None when ``backend`` can start sandboxes here; else why not."""
    return get_backend(backend).problem()


def strong_names(usable: Sequence[str] | None = None) -> tuple[str, ...]:
    """The strong backends ``auto`` may pick, in the order it tries them."""
    return tuple(name for name, backend in registered().items()
                 if backend.strong and (usable is None or name in usable))


def resolve_backend(requested: str, usable: Sequence[str] | None = None) -> str:
    """The backend to use for ``requested`` (a backend name or 'auto'), out of those the caller can use
    (``usable``; default: every installed backend).

    Raises :class:`BackendUnavailable` naming what is missing when nothing strong enough can run,
    and never falls back to a weak backend by itself.
    """
    names = backend_names()
    usable = names if usable is None else tuple(usable)
    if requested not in (*names, "auto"):
        raise SandboxError(f"unknown sandbox backend {requested!r}; choose one of auto, {', '.join(names)}")
    required = os.environ.get(REQUIRE_ENV, "").strip()
    if required:
        if required not in names:
            raise SandboxError(f"{REQUIRE_ENV}={required!r} is not a sandbox backend ({', '.join(names)})")
        if requested not in ("auto", required):
            raise SandboxError(f"the config asks for sandbox backend {requested!r} but {REQUIRE_ENV}={required}")
        requested = required
    if requested != "auto" and requested not in usable:
        raise SandboxError(f"sandbox backend {requested!r} cannot run this program; usable: {', '.join(usable)}")
    if requested != "auto" and not get_backend(requested).strong:
        if requested not in _warned_weak:
            _warned_weak.add(requested)
            log.warning("sandbox backend %r is weaker: %s", requested, get_backend(requested).protects)
        return requested
    candidates = [requested] if requested != "auto" else list(strong_names(usable))
    problems = []
    for name in candidates:
        problem = backend_problem(name)
        if problem is None:
            return name
        problems.append(f"{name}: {problem}")
    if not candidates:
        raise BackendUnavailable("auto", f"no strong sandbox backend is installed that can run this program "
                                         f"(usable: {', '.join(usable)})")
    hint = "; or ".join(get_backend(name).install_hint for name in candidates)
    weak = [name for name in usable if not get_backend(name).strong]
    opt_in = f", or opt in to a weaker backend with backend={weak[0]}" if weak else ""
    raise BackendUnavailable(candidates[0], f"sandbox backend {requested!r} is not usable here "
                             f"({'; '.join(problems)}). To fix: {hint}{opt_in}.")
