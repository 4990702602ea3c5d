"""``skyrl-sandbox doctor`` says which backends work and what is missing."""

from __future__ import annotations

import os
import subprocess
import sys

from skyrl_sandbox.backends import bwrap_problem


def doctor(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skyrl_sandbox.cli", "doctor"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_doctor_lists_every_backend_and_protection():
    done = doctor()
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert names[:5] == ["bwrap", "docker", "subprocess", "cgroups", "seccomp"]
    if bwrap_problem() is None:
        assert done.returncode == 0 and "backend 'auto' picks: bwrap" in done.stdout


def test_doctor_says_what_is_missing_and_fails_when_nothing_strong_works():
    done = doctor(PATH="/nonexistent", DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert done.returncode == 1
    assert "bwrap       missing  bwrap is not installed" in done.stdout
    assert "docker      missing" in done.stdout and "no Docker Engine answers" in done.stdout
    assert "backend 'auto' picks: nothing (install bubblewrap or Docker)" in done.stdout
