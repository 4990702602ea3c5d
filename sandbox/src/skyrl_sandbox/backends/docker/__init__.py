"""The ``docker`` backend, and the container backend every Docker-API runtime is built from.

A container of a Docker-API engine: no network, read-only root file system, capabilities dropped,
no-new-privileges, pids/memory/CPU limits, a non-root user. :class:`ContainerBackend` holds what is the
same for every runtime; an engine (:class:`~skyrl_sandbox.container_engine.ContainerEngine`) says where the
runtime listens and how it differs. Another runtime's package makes its backend as this one does below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...container_engine import ContainerEngine
from .client import DOCKER

if TYPE_CHECKING:
    from ...launch import WorkerProgram
    from ...limits import Limits
    from ...machine import Machine, MachineSpec
    from ...worker import Worker


class ContainerBackend:
    """A backend whose sandboxes are containers of ``engine``."""

    strong = True
    runs_images = True
    has_machines = True
    owns_limits = True
    holds_children = False  # a worker's container has one process budget and no in-process policy for its children

    def __init__(self, name: str, engine: ContainerEngine, *, auto_rank: int, protects: str, install_hint: str) -> None:
        self.name = name
        self.engine = engine
        self.auto_rank = auto_rank
        self.protects = protects
        self.install_hint = install_hint
        self.ray_resource = name

    def problem(self) -> str | None:
        return self.engine.problem()

    def start_worker(self, program: WorkerProgram, limits: Limits, image: str | None) -> Worker:
        from .worker import start_container_worker  # on use: importing a backend starts no engine client

        return start_container_worker(self.engine, program, limits, image, self.name)

    async def start_machine(self, spec: MachineSpec) -> Machine:
        from .machine import ContainerMachine

        return await ContainerMachine.start(self.engine, spec, self.name)

    def sweep(self) -> dict[str, int]:
        from .worker import sweep_stale_containers

        return {"containers": len(sweep_stale_containers(self.engine))}


BACKEND = ContainerBackend(
    "docker", DOCKER, auto_rank=20,
    protects=("a container of a Docker Engine: no network, read-only root file system, capabilities dropped, "
              "no-new-privileges, pids/memory/CPU limits, a non-root user"),
    install_hint=("install the docker extra (pip install 'skyrl-sandbox[docker]') and start a Docker Engine "
                  "(scripts/setup.sh starts one)"))
