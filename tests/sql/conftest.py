"""The built-in databases are generated once per test session into a temporary folder; sandbox backends
are skipped with the reason where they cannot run (failed instead where CI requires them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from skyrl_sandbox.testing import require_backend


@pytest.fixture(scope="session", autouse=True)
def sql_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("skyrl_sql_cache")
    cache.chmod(0o755)  # docker workers run as a uid of their own and must read the databases
    previous = os.environ.get("SKYRL_SQL_CACHE")
    os.environ["SKYRL_SQL_CACHE"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("SKYRL_SQL_CACHE", None)
    else:
        os.environ["SKYRL_SQL_CACHE"] = previous


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The sandbox backend of a test parametrized with ``indirect=True`` over ``sql_helpers.BACKENDS``."""
    require_backend(request.param)
    return request.param


@pytest.fixture
def require_bwrap() -> None:
    require_backend("bwrap")
