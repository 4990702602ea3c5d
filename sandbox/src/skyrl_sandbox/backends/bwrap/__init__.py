"""The ``bwrap`` backend: bubblewrap namespaces (no network, own PID/user/mount namespaces, read-only minimal
mounts, capabilities dropped) plus rlimits, cgroups and seccomp; machines over the host's own tools."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...dirs import make_host_dir
from ...process import start_process_worker
from .plan import plan_bwrap
from .probe import bwrap_problem

if TYPE_CHECKING:
    from ...launch import WorkerProgram
    from ...limits import Limits
    from ...machine import Machine, MachineSpec
    from ...worker import Worker

# bwrap's own processes in the worker's pids group: the outer bwrap and the namespace's init.
BWRAP_TASKS = 2


class BwrapBackend:
    name = "bwrap"
    strong = True
    auto_rank = 10
    protects = ("bubblewrap namespaces: no network, own PID, user and mount namespaces, read-only system folders, "
                "no capabilities; plus rlimits, cgroups and seccomp")
    install_hint = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; in containers it also needs user "
                    "namespaces)")
    runs_images = False
    has_machines = True
    owns_limits = False
    holds_children = True
    ray_resource = "bwrap"
    engine = None

    def problem(self) -> str | None:
        return bwrap_problem()

    def start_worker(self, program: WorkerProgram, limits: Limits, image: str | None) -> Worker:
        host_dir = make_host_dir()
        return start_process_worker(self.name, plan_bwrap(program, host_dir, limits), host_dir, limits, BWRAP_TASKS)

    async def start_machine(self, spec: MachineSpec) -> Machine:
        from .machine import BwrapMachine  # on use: the machine code is not needed by workers

        return await BwrapMachine.start(spec)

    def sweep(self) -> dict[str, int]:
        return {}  # its folders and cgroups are the host's, swept for every backend by skyrl_sandbox.node


BACKEND = BwrapBackend()
