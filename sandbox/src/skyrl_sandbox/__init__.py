"""Isolation for model-written code, shared by every env that runs it.

One backend vocabulary (``bwrap``, ``docker``, ``subprocess``, ``auto``), one probe, one error
hierarchy; worker processes that speak length-prefixed, size-capped JSON frames; warm pools;
cgroups, rlimits and a seccomp filter; cleanup on close, at exit and after the owner was killed;
whole machines (a container, or bwrap over the host's tools) with a persistent terminal shell for
agents that work in Linux.
Standard library only at import time (the ``docker`` SDK is an optional extra, loaded on use).
"""

from .backends import BACKENDS, REQUIRE_ENV, backend_problem, resolve_backend
from .channel import BlockingChannel
from .errors import BackendUnavailable, ProcessesSurvived, ProtocolViolation, SandboxError, WorkerGone
from .launch import WorkerProgram
from .limits import Limits
from .machine import Machine, MachineSpec
from .machine_factory import start_machine
from .pool import WorkerPool
from .startup import WorkerSetup, start_worker, start_worker_blocking
from .worker import Worker

__all__ = ["BACKENDS", "REQUIRE_ENV", "BackendUnavailable", "BlockingChannel", "Limits", "Machine", "MachineSpec",
           "ProcessesSurvived", "ProtocolViolation", "SandboxError", "Worker", "WorkerGone", "WorkerPool",
           "WorkerProgram", "WorkerSetup", "backend_problem", "resolve_backend", "start_machine", "start_worker",
           "start_worker_blocking"]
