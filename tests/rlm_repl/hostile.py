"""What the hostile-code tests share: backends, a tight config, and code that finds the worker's channel."""

from __future__ import annotations

import pytest
from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig
from skyrl_sandbox.images import base_image_unavailable
from skyrl_sandbox.testing import skip_unless_usable

# Skipped with the reason where a backend cannot run, unless SKYRL_REQUIRE_<BACKEND>=1 (CI), where the tests
# run and fail on it. Docker also needs the base image (or a way to build it).
BWRAP_SKIP = skip_unless_usable("bwrap")
DOCKER_SKIP = skip_unless_usable("docker", problem=base_image_unavailable())
BACKENDS = [pytest.param("bwrap", marks=BWRAP_SKIP), pytest.param("docker", marks=DOCKER_SKIP), "subprocess"]
# The backends whose boundary holds in the kernel even when model code switches the audit policy off.
KERNEL_BACKENDS = [pytest.param("bwrap", marks=BWRAP_SKIP), pytest.param("docker", marks=DOCKER_SKIP)]

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


# Model code that finds the worker's end of the channel and writes raw bytes to it.
FIND_CHANNEL = "import os\npipes = [fd for fd in range(3, 64) if _is_pipe(fd)]\n"
WRITE_ALL = "for fd in pipes:\n    try:\n        os.write(fd, {payload})\n    except OSError:\n        pass\n"
IS_PIPE = ("def _is_pipe(fd):\n    import os, stat\n    try:\n        return stat.S_ISFIFO(os.fstat(fd).st_mode)\n"
           "    except OSError:\n        return False\n")


# The current execution's token, as code that reads the worker's memory can find it.
FIND_TOKEN = ("import gc\ntoken = next(o for o in gc.get_objects() "
              "if type(o).__name__ == 'RequestSender').token.encode()\n")
FRAME = "(lambda m: len(m).to_bytes(4, 'big') + m)"
