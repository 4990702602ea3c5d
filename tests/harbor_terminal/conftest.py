"""Harbor terminal tests run on every machine backend this host has; CI requires each (SKYRL_REQUIRE_*=1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from skyrl_sandbox.machine_factory import machine_backends
from skyrl_sandbox.testing import require_backend

sys.path.insert(0, str(Path(__file__).parent))  # task_fixtures, harbor_helpers

MACHINE_BACKENDS = machine_backends()  # every installed backend with machines: bwrap, docker, podman, ...


@pytest.fixture(params=MACHINE_BACKENDS)
def machine_backend(request: pytest.FixtureRequest) -> str:
    """Each machine backend in turn, skipped (failed under SKYRL_REQUIRE_<BACKEND>=1) where it cannot run."""
    require_backend(request.param)
    return request.param


@pytest.fixture
def docker_backend() -> str:
    require_backend("docker")
    return "docker"


@pytest.fixture
def bwrap_backend() -> str:
    require_backend("bwrap")
    return "bwrap"
