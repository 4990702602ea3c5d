"""Starting a machine on a backend by name: the factory apart from the base class in :mod:`.machine`, which
knows none of its implementations (:mod:`.docker_machine`, :mod:`.bwrap_machine`)."""

from __future__ import annotations

from .machine import MACHINE_BACKENDS, Machine, MachineSpec


async def start_machine(spec: MachineSpec, backend: str = "docker") -> Machine:
    """Start a machine on ``backend`` ("docker" or "bwrap"); raises BackendUnavailable where it cannot run."""
    if backend == "docker":
        from .docker_machine import DockerMachine  # on use: importing skyrl_sandbox starts no backend

        return await DockerMachine.start(spec)
    if backend == "bwrap":
        from .bwrap_machine import BwrapMachine

        return await BwrapMachine.start(spec)
    raise ValueError(f"unknown machine backend {backend!r}; choose one of {', '.join(MACHINE_BACKENDS)}")
