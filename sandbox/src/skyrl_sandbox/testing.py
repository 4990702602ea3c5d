"""For test suites of envs that use skyrl-sandbox: run on every backend the machine has, fail where CI needs one."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

from .choice import backend_problem


def require_backend(backend: str) -> None:
    """Skip the calling test when ``backend`` cannot run here, with the reason; fail instead when
    ``SKYRL_REQUIRE_<BACKEND>=1`` (CI sets it, so a backend that cannot start fails the run)."""
    import pytest

    problem = backend_problem(backend)
    if problem is None:
        return
    if os.environ.get(f"SKYRL_REQUIRE_{backend.upper()}") == "1":
        pytest.fail(f"SKYRL_REQUIRE_{backend.upper()}=1 but the {backend} backend cannot run here: {problem}")
    pytest.skip(f"the {backend} backend cannot run here: {problem}")


def skip_unless_usable(backend: str, problem: str | None = None):
    """A ``skipif`` mark for tests (or parameters) that need ``backend``; under ``SKYRL_REQUIRE_<BACKEND>=1``
    it never skips, so the tests run and fail on what is missing. ``problem`` overrides the probe."""
    import pytest

    if os.environ.get(f"SKYRL_REQUIRE_{backend.upper()}") == "1":
        return pytest.mark.skipif(False, reason="")
    problem = backend_problem(backend) if problem is None else problem
    return pytest.mark.skipif(problem is not None, reason=f"the {backend} backend cannot run here: {problem}")


@contextlib.contextmanager
def loop_hops() -> Iterator[list[str]]:
    """Record each coroutine handed to another thread's event loop inside the block (by name), e.g. an env's
    trips to the sandbox loop and a sandbox's sub-calls back to the caller's loop."""
    hops: list[str] = []
    handoff = asyncio.run_coroutine_threadsafe

    def counted(coro, loop):  # noqa: ANN001, ANN202 - asyncio's own signature
        hops.append(getattr(coro, "__qualname__", type(coro).__name__))
        return handoff(coro, loop)

    asyncio.run_coroutine_threadsafe = counted
    try:
        yield hops
    finally:
        asyncio.run_coroutine_threadsafe = handoff


# Python source that connects to addresses off the box and prints each one's errno name (or "connected"):
# in a machine with no route anywhere, every line ends in ENETUNREACH.
NO_ROUTE_PROBE = """
import errno, socket
for address in ("1.1.1.1", "10.0.0.1", "172.17.0.1", "192.168.0.1"):
    probe = socket.socket()
    probe.settimeout(3)
    try:
        probe.connect((address, 80))
        print(address, "connected")
    except OSError as exc:
        print(address, errno.errorcode.get(exc.errno, exc))
"""
