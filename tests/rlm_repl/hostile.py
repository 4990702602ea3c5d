"""What the hostile-code tests share: backends, a tight config, and (from skyrl_rlm_repl.probes) code that finds
the worker's channel."""

from __future__ import annotations

import pytest
from skyrl_rlm_repl.probes import FIND_CHANNEL, FIND_TOKEN, FRAME, IS_PIPE, WRITE_ALL  # noqa: F401 - the probes' own
from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig
from skyrl_sandbox.backends.docker.images import base_image_unavailable
from skyrl_sandbox.registry import registered
from skyrl_sandbox.testing import skip_unless_usable


def usable(name: str):
    """``name`` as a parameter, skipped with the reason where it cannot run, unless SKYRL_REQUIRE_<BACKEND>=1 (CI),
    where the tests run and fail on it. A container backend also needs the base image (or a way to build it)."""
    engine = registered()[name].engine
    return pytest.param(name, marks=skip_unless_usable(name, problem=None if engine is None else
                                                       base_image_unavailable(engine)))


BWRAP_SKIP = skip_unless_usable("bwrap")  # for tests of bwrap alone
# Every installed backend (the weaker subprocess one too, which is never skipped: it runs anywhere).
BACKENDS = [usable(name) if backend.strong else name for name, backend in registered().items()]
# The backends whose boundary holds in the kernel even when model code switches the audit policy off.
KERNEL_BACKENDS = [usable(name) for name, backend in registered().items() if backend.strong]

def hostile_config(backend: str, **overrides) -> SandboxConfig:
    return SandboxConfig(**{"backend": backend, "exec_timeout_s": 2.0, "cpu_time_s": 20, "memory_mb": 512,
                            **overrides})


async def still_healthy(box: Sandbox) -> bool:
    result = await box.execute("print(context, 6 * 7)")
    return result.error is None and result.stdout == "public context 42\n"


# Model code that switches the in-process audit policy off, to show the kernel-level layers hold alone.
TAMPER_POLICY = ("import gc\n"
                 "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
                 "policy.allow_subprocesses = True\n")
DISABLE_POLICY = ("import gc\n"
                  "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
                  "type(policy).check.__code__ = (lambda self, event, args: None).__code__\n")

