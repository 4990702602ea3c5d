"""Starting a machine on a backend by name, apart from the base class in :mod:`.machine`, which knows none of
its implementations."""

from __future__ import annotations

from .errors import BackendUnavailable
from .machine import Machine, MachineSpec
from .registry import get_backend, registered


def machine_backends() -> tuple[str, ...]:
    """The installed backends that start machines."""
    return tuple(name for name, backend in registered().items() if backend.has_machines)


async def start_machine(spec: MachineSpec, backend: str) -> Machine:
    """Start a machine on ``backend``; raises BackendUnavailable where it cannot run."""
    chosen = get_backend(backend)
    if not chosen.has_machines:
        raise BackendUnavailable(backend, f"the {backend} backend has no machines; backends with machines: "
                                          f"{', '.join(machine_backends())}")
    return await chosen.start_machine(spec)
