"""For test suites of envs that use skyrl-sandbox: run on every backend the machine has, fail where CI needs one."""

from __future__ import annotations

import os

from .backends import backend_problem


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
