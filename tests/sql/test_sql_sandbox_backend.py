"""Choosing the sandbox backend of the sql env: auto never falls back to the weaker subprocess backend,
SKYRL_SANDBOX requires one for the run, old and unsupported names give clear config errors, and the
env reports the backend it used."""

from __future__ import annotations

import itertools

import pytest
from skyrl_core import make_env
from skyrl_core.factory import ConfigError
from skyrl_sandbox import BackendUnavailable, SandboxError, backend_names
from skyrl_sandbox.backends.bwrap.probe import bwrap_problem
from skyrl_sql.config import SQLEnvConfig
from skyrl_sql.env import SQLEnv
from skyrl_sql.sandbox import QueryRunner, SandboxSettings
from sql_helpers import THINK, task


@pytest.fixture
def no_strong_backend(monkeypatch):
    """A machine where bubblewrap is not installed and no Docker Engine answers."""
    bwrap_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    yield
    bwrap_problem.cache_clear()


_unused_memory_limits = itertools.count(1001)


def fresh_env(**options) -> SQLEnv:
    """An env whose runner settings no other env uses (runners are shared per settings and process, and
    resolve their backend when made)."""
    return SQLEnv(task(), {"memory_limit_mb": next(_unused_memory_limits), **options})


def test_process_is_a_deprecated_name_of_subprocess():
    with pytest.warns(FutureWarning, match="env.sandbox='process' is deprecated; use 'subprocess'"):
        config = SQLEnvConfig(sandbox="process")
    assert config.sandbox == "subprocess"


def test_unsupported_backends_are_config_errors_that_name_the_choices():
    with pytest.raises(ConfigError, match="env.sandbox") as caught:
        make_env("sql", task(), {"sandbox": "firejail"})
    assert f"sandbox backend 'firejail' is not installed; choose one of auto, {', '.join(backend_names())}" in str(
        caught.value)


def test_a_cpu_limit_shorter_than_the_query_limits_is_a_config_error():
    with pytest.raises(ConfigError, match="sandbox_cpu_time_s=40 must be at least 64"):
        make_env("sql", task(), {"sandbox_cpu_time_s": 40})
    assert SQLEnvConfig(sandbox_cpu_time_s=40, reward_timeout_s=10).sandbox_cpu_time_s == 40


def test_auto_without_bwrap_or_docker_is_an_error_saying_what_to_do_never_a_fallback(no_strong_backend):
    with pytest.raises(BackendUnavailable) as caught:
        QueryRunner(SandboxSettings("auto", memory_mb=1001))
    message = str(caught.value)
    assert "bwrap is not installed" in message and "apt-get install bubblewrap" in message
    assert "docker: " in message and "/nonexistent/docker.sock" in message
    assert "backend=subprocess" in message and f"env.sandbox (auto, {', '.join(backend_names())})" in message
    with pytest.raises(BackendUnavailable, match="'bwrap' is not usable here"):
        fresh_env(sandbox="bwrap").reset(seed=0)
    env = fresh_env(sandbox="subprocess")  # the weaker backend only when asked for by name
    env.reset(seed=0)
    assert env.backend == "subprocess"


def test_skyrl_sandbox_requires_one_backend_for_the_run(monkeypatch):
    monkeypatch.setenv("SKYRL_SANDBOX", "subprocess")
    env = fresh_env(sandbox_workers=2)
    _, info = env.reset(seed=0)
    assert env.backend == info["sandbox_backend"] == "subprocess"
    with pytest.raises(SandboxError, match="the config asks for sandbox backend 'bwrap' but SKYRL_SANDBOX=subprocess"):
        fresh_env(sandbox="bwrap", sandbox_workers=2).reset(seed=0)
    monkeypatch.setenv("SKYRL_SANDBOX", "docker")
    with pytest.raises(SandboxError, match="the config asks for sandbox backend 'subprocess' but SKYRL_SANDBOX=docker"):
        fresh_env(sandbox="subprocess", sandbox_workers=3).reset(seed=0)


@pytest.mark.parametrize("backend", ["bwrap", "subprocess"], indirect=True)
def test_the_backend_is_reported_in_info_and_metrics(backend):
    env = SQLEnv(task(), {"sandbox": backend})
    _, info = env.reset(seed=0)
    assert info["sandbox_backend"] == backend
    assert env.step(f"{THINK}<sql>SELECT 1</sql>").info["sandbox_backend"] == backend
    scored = env.step(f"{THINK}<solution>SELECT COUNT(*) FROM employees</solution>")
    assert scored.reward == 1.0 and scored.info["sandbox_backend"] == backend
    assert env.get_metrics()["sandbox_strong"] == float(backend == "bwrap")
