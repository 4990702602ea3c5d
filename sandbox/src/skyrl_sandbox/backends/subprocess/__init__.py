"""The ``subprocess`` backend: a plain child process with rlimits, seccomp and an in-process audit policy.

Weaker (determined code can defeat the policy), so ``auto`` never picks it: a config must name it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...dirs import make_host_dir
from ...errors import BackendUnavailable
from ...process import start_process_worker
from .plan import plan_subprocess

if TYPE_CHECKING:
    from ...launch import WorkerProgram
    from ...limits import Limits
    from ...machine import Machine, MachineSpec
    from ...worker import Worker


class SubprocessBackend:
    name = "subprocess"
    strong = False
    auto_rank = 0
    protects = ("a plain child process with no namespaces, guarded by rlimits, seccomp and (in Python workers) an "
                "in-process audit policy that determined code can defeat, after which it can read the host's files "
                "and reach the network as the user it runs as. Use it only for trusted code or where no strong "
                "backend can run")
    install_hint = "nothing to install: it runs wherever Python does"
    runs_images = False
    has_machines = False
    owns_limits = False
    holds_children = False
    ray_resource = None
    engine = None

    def problem(self) -> str | None:
        return None

    def start_worker(self, program: WorkerProgram, limits: Limits, image: str | None) -> Worker:
        host_dir = make_host_dir()
        return start_process_worker(self.name, plan_subprocess(program, host_dir, limits), host_dir, limits)

    async def start_machine(self, spec: MachineSpec) -> Machine:
        raise BackendUnavailable(self.name, "the subprocess backend has no machines (no file system of its own)")

    def sweep(self) -> dict[str, int]:
        return {}


BACKEND = SubprocessBackend()
