"""What a sandbox backend is: the contract each backend package fulfils.

A backend is one object, registered under its name in the entry-point group ``skyrl_sandbox.backends``
(see :mod:`.registry`). Everything that chooses, probes, places or sweeps sandboxes (``auto``, the
doctor, Ray node resources, every env's ``backend`` option) reads the registered backends and their
attributes, so a new backend is one package and one entry point::

    [project.entry-points."skyrl_sandbox.backends"]
    podman = "skyrl_sandbox_podman:BACKEND"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .container_engine import ContainerEngine
    from .launch import WorkerProgram
    from .limits import Limits
    from .machine import Machine, MachineSpec
    from .worker import Worker


@runtime_checkable
class SandboxBackend(Protocol):
    """One way to hold model-written code in: its name, its strength, and how it starts what runs inside."""

    name: str  # the value of every env's ``backend`` option (and of SKYRL_SANDBOX)
    strong: bool  # the boundary holds without the in-process policy: ``auto`` may pick it
    auto_rank: int  # ``auto`` tries strong backends in increasing rank
    protects: str  # one line: what keeps sandboxed code in (the doctor prints it)
    install_hint: str  # what to do when :meth:`problem` answers
    runs_images: bool  # its machines are containers of an image built on its own engine (else the host's tools)
    has_machines: bool  # :meth:`start_machine` works (whole Linux machines for terminal agents)
    owns_limits: bool  # its own cgroups bind a worker's memory and processes (no host cgroup needed)
    holds_children: bool  # a worker's child processes stay inside (own PID namespace): model code may fork
    ray_resource: str | None  # the custom Ray resource of nodes where it runs; None: it needs no special node
    engine: ContainerEngine | None  # where its images are built and kept (backends that run images); else None

    def problem(self) -> str | None:
        """None when this backend can start sandboxes here; else why not, in words."""

    def start_worker(self, program: WorkerProgram, limits: Limits, image: str | None) -> Worker:
        """Start one worker process of ``program`` (blocking; called from the pool's spawner thread)."""

    async def start_machine(self, spec: MachineSpec) -> Machine:
        """Start a machine; raises :class:`~skyrl_sandbox.errors.BackendUnavailable` where it cannot."""

    def sweep(self) -> dict[str, int]:
        """Remove what owners that died on this machine left on this backend; counts by kind."""
