"""``skyrl-sandbox doctor`` says which backends work and what is missing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from skyrl_sandbox import backend_names
from skyrl_sandbox.backends.bwrap.probe import bwrap_problem
from skyrl_sandbox.choice import strong_names


def doctor(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skyrl_sandbox.cli", "doctor"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_doctor_lists_every_backend_and_protection():
    done = doctor()
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert names == [*backend_names(), "cgroups", "seccomp", "backend"]  # every installed one, in auto's order
    assert re.search(r"^subprocess +opt-in +weaker, used only when a config names it: a plain child", done.stdout, re.M)
    if bwrap_problem() is None:
        assert done.returncode == 0 and re.search(r"^bwrap +ok +ready: bubblewrap namespaces", done.stdout, re.M)
        assert "backend 'auto' picks: bwrap" in done.stdout


def test_doctor_says_what_is_missing_and_fails_when_nothing_strong_works():
    done = doctor(PATH="/nonexistent", DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert done.returncode == 1
    assert re.search(r"^bwrap +missing +bwrap is not installed\. To fix: install bubblewrap", done.stdout, re.M)
    assert re.search(r"^docker +missing +no Docker [Ee]ngine answers .*To fix: install the docker", done.stdout, re.M)
    assert f"backend 'auto' picks: nothing (install one of: {', '.join(strong_names())})" in done.stdout
