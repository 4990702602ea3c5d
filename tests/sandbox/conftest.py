"""Shared fixtures of the skyrl-sandbox tests: a box on every backend."""

from __future__ import annotations

import signal

import pytest
from skyrl_sandbox import Limits
from skyrl_sandbox.box import Box
from skyrl_sandbox.testing import require_backend

TIGHT = Limits(cpu_time_s=20, memory_mb=512, max_processes=32, max_file_size_mb=16, tmp_size_mb=32)


@pytest.fixture(params=["bwrap", "docker", "subprocess"])
def backend(request) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture
def limits() -> Limits:
    return TIGHT


@pytest.fixture
async def box(backend, limits):
    async with await Box.create(backend, limits) as created:
        yield created


@pytest.fixture
def host_ignores_interrupts():
    """This process ignores SIGINT and SIGQUIT while the test runs, as a job started with ``&`` from a script does."""
    saved = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGQUIT)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)

