"""Choosing a backend: auto never picks a weak one, a required one must work, errors say what is missing."""

from __future__ import annotations

import pytest
from skyrl_sandbox import BackendUnavailable, SandboxError, backends, resolve_backend


@pytest.fixture
def no_strong_backend(monkeypatch):
    """A machine where neither bubblewrap nor a Docker Engine can run."""
    backends.bwrap_problem.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(backends, "docker_problem", lambda: "no Docker Engine answers")
    yield
    backends.bwrap_problem.cache_clear()


def test_a_missing_backend_is_a_clear_error_never_a_fallback(no_strong_backend):
    with pytest.raises(BackendUnavailable, match="'bwrap' is not usable here \\(bwrap: bwrap is not installed\\)"):
        resolve_backend("bwrap")
    with pytest.raises(BackendUnavailable, match="apt-get install bubblewrap.*docker.*backend=subprocess") as caught:
        resolve_backend("auto")
    assert caught.value.backend == "bwrap"
    assert resolve_backend("subprocess") == "subprocess"  # only when asked for by name


def test_auto_picks_only_backends_the_caller_can_use(no_strong_backend):
    with pytest.raises(BackendUnavailable) as caught:
        resolve_backend("auto", usable=("bwrap", "subprocess"))
    assert "docker" not in str(caught.value) and "backend=subprocess" in str(caught.value)
    with pytest.raises(SandboxError, match="cannot run this program; usable: bwrap, subprocess"):
        resolve_backend("docker", usable=("bwrap", "subprocess"))


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
