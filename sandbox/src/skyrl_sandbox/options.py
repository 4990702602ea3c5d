"""The ``backend`` option of every env that runs sandboxed code: one pydantic type and one description,
both read from the installed backends (:mod:`.registry`), so a new backend is a choice everywhere at once.

Only env configs import this module: it needs pydantic, and ``import skyrl_sandbox`` stays standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, Field

from .choice import REQUIRE_ENV
from .registry import registered

__all__ = ["MachineBackend", "WorkerBackend", "backend_description"]


def _choices(machines: bool) -> tuple[str, ...]:
    """``auto`` and the installed backends (with ``machines``: those that start machines)."""
    return ("auto", *(name for name, backend in registered().items() if backend.has_machines or not machines))


def _checker(machines: bool) -> Callable[[str], str]:
    def check(value: str) -> str:
        choices = _choices(machines)
        if value in choices:
            return value
        what = "has no machines" if value in registered() else "is not installed"
        raise ValueError(f"sandbox backend {value!r} {what}; choose one of {', '.join(choices)}")
    return check


def _listed(machines: bool) -> Callable[[dict], None]:
    def add_choices(schema: dict) -> None:
        schema["enum"] = list(_choices(machines))
    return add_choices


WorkerBackend = Annotated[str, AfterValidator(_checker(machines=False)), Field(json_schema_extra=_listed(False))]
"""``auto`` or the name of an installed backend: where an env's worker processes run."""

MachineBackend = Annotated[str, AfterValidator(_checker(machines=True)), Field(json_schema_extra=_listed(True))]
"""``auto`` or the name of an installed backend that starts whole machines (:attr:`SandboxBackend.has_machines`)."""


def backend_description(extra: str = "", *, machines: bool = False) -> str:
    """The description of a ``backend`` option: what ``auto`` picks, what each installed backend protects
    with, and ``extra`` (what the option means for one env). ``machines``: only backends with machines."""
    backends = [registered()[name] for name in _choices(machines)[1:]]
    auto = [backend.name for backend in backends if backend.strong]  # registered() keeps auto's order
    parts = [f"auto: the first of {', '.join(auto) or 'none installed'} that works here (else an error saying what "
             "to install; never a silent fallback to a weaker backend)"]
    parts += [f"{backend.name}: {backend.protects}{'' if backend.strong else ' (weaker: opt-in only)'}"
              for backend in backends]
    text = f"Sandbox backend. {'; '.join(parts)}. {REQUIRE_ENV}=<name> requires one backend for the whole run."
    return f"{text} {extra}".strip()
