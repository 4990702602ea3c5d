"""Isolation for model-written code, shared by every env that runs it.

Backends as plugins (:class:`SandboxBackend`, registered in the entry-point group ``skyrl_sandbox.backends``;
built in: ``bwrap``, ``docker``, ``subprocess``), one choice (``auto`` or a name), one error hierarchy; worker processes that speak length-prefixed, size-capped JSON frames; warm pools;
cgroups, rlimits and a seccomp filter; cleanup on close, at exit and after the owner was killed;
whole machines (a container, or bwrap over the host's tools) with a persistent terminal shell for
agents that work in Linux.
Standard library only at import time (the ``docker`` SDK is an optional extra, loaded on use).
"""

from .backend import SandboxBackend
from .channel import BlockingChannel
from .choice import REQUIRE_ENV, backend_problem, resolve_backend
from .errors import BackendUnavailable, ProcessesSurvived, ProtocolViolation, SandboxError, WorkerGone
from .launch import WorkerProgram
from .limits import Limits
from .machine import Machine, MachineSpec
from .machine_factory import start_machine
from .pool import WorkerPool
from .registry import backend_names, get_backend, registered
from .startup import WorkerSetup, start_worker, start_worker_blocking
from .worker import Worker

__all__ = ["REQUIRE_ENV", "BackendUnavailable", "BlockingChannel", "Limits", "Machine", "MachineSpec",
           "ProcessesSurvived", "ProtocolViolation", "SandboxBackend", "SandboxError", "Worker", "WorkerGone",
           "WorkerPool", "WorkerProgram", "WorkerSetup", "backend_names", "backend_problem", "get_backend", "registered",
           "resolve_backend", "start_machine", "start_worker", "start_worker_blocking"]
