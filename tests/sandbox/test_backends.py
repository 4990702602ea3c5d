"""Choosing a backend: auto never picks a weak one, a required one must work, errors say what is missing."""

from __future__ import annotations

import logging

import pytest
from skyrl_sandbox import BackendUnavailable, SandboxError, backend_names, get_backend, registered, resolve_backend
from skyrl_sandbox.backends.bwrap.probe import bwrap_problem
from skyrl_sandbox.choice import strong_names
from skyrl_sandbox.node import node_resources, worker_resources


@pytest.fixture
def no_strong_backend(monkeypatch):
    """A machine where neither bubblewrap nor any container engine (Docker, another installed one) can run."""
    bwrap_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    for backend in registered().values():
        if backend.strong and backend.name != "bwrap":
            monkeypatch.setattr(backend, "problem", lambda name=backend.name: f"no {name} engine answers")
    yield
    bwrap_problem.cache_clear()


def test_the_built_in_backends_are_registered_strong_first_in_auto_order():
    assert backend_names()[:2] == ("bwrap", "docker") and "subprocess" in backend_names()
    assert strong_names()[:2] == ("bwrap", "docker") and "subprocess" not in strong_names()
    assert all(backend.name == name for name, backend in registered().items())


def test_a_missing_backend_is_a_clear_error_never_a_fallback(no_strong_backend):
    with pytest.raises(BackendUnavailable, match="'bwrap' is not usable here \\(bwrap: bwrap is not installed\\)"):
        resolve_backend("bwrap")
    with pytest.raises(BackendUnavailable, match="apt-get install bubblewrap.*docker.*backend=subprocess") as caught:
        resolve_backend("auto")
    assert caught.value.backend == "bwrap"
    assert resolve_backend("subprocess") == "subprocess"  # only when asked for by name


def test_a_weak_backend_warns_once_with_what_it_protects(monkeypatch, caplog):
    monkeypatch.setattr("skyrl_sandbox.choice._warned_weak", set())
    with caplog.at_level(logging.WARNING, logger="skyrl_sandbox.choice"):
        assert resolve_backend("subprocess") == resolve_backend("subprocess") == "subprocess"
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"sandbox backend 'subprocess' is weaker: {get_backend('subprocess').protects}"]


def test_auto_picks_only_backends_the_caller_can_use(no_strong_backend):
    with pytest.raises(BackendUnavailable) as caught:
        resolve_backend("auto", usable=("bwrap", "subprocess"))
    assert "docker" not in str(caught.value) and "backend=subprocess" in str(caught.value)
    with pytest.raises(SandboxError, match="cannot run this program; usable: bwrap, subprocess"):
        resolve_backend("docker", usable=("bwrap", "subprocess"))
    with pytest.raises(BackendUnavailable, match="no strong sandbox backend is installed that can run this program"):
        resolve_backend("auto", usable=("subprocess",))


def test_skyrl_sandbox_requires_one_backend_for_the_run(monkeypatch, no_strong_backend):
    monkeypatch.setenv("SKYRL_SANDBOX", "subprocess")
    assert resolve_backend("auto") == "subprocess"
    with pytest.raises(SandboxError, match="asks for sandbox backend 'bwrap' but SKYRL_SANDBOX=subprocess"):
        resolve_backend("bwrap")
    monkeypatch.setenv("SKYRL_SANDBOX", "bwrap")
    with pytest.raises(BackendUnavailable, match="bwrap is not installed"):
        resolve_backend("auto")  # required and missing: an error, not a skip
    monkeypatch.setenv("SKYRL_SANDBOX", "firecracker")
    with pytest.raises(SandboxError, match="SKYRL_SANDBOX='firecracker' is not a sandbox backend"):
        resolve_backend("auto")


def test_unknown_backend_names_are_refused():
    with pytest.raises(SandboxError, match="unknown sandbox backend 'chroot'; choose one of auto, bwrap, docker"):
        resolve_backend("chroot")
    with pytest.raises(SandboxError, match="unknown sandbox backend 'chroot'; installed: bwrap, docker"):
        get_backend("chroot")


def test_ray_resources_come_from_each_backends_ray_resource(no_strong_backend):
    assert worker_resources("bwrap") == {"bwrap": 1.0} and worker_resources("docker") == {"docker": 1.0}
    assert worker_resources("subprocess") == {}  # needs no special node
    assert worker_resources("auto") == {"bwrap": 1.0}  # the first strong backend
    assert worker_resources("auto", auto="docker") == {"docker": 1.0}
    assert node_resources(slots=3) == {}  # nothing offered where nothing works
