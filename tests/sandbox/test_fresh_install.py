"""skyrl-sandbox installs alone (standard library only, no other distribution) and runs a box."""

from __future__ import annotations

from pathlib import Path

import pytest
from skyrl_sandbox.testing import require_backend

REPO = Path(__file__).resolve().parents[2]
RUN_A_BOX = ("import asyncio\nfrom skyrl_sandbox.box import run\n"
             "print(asyncio.run(run(['sh', '-c', 'echo isolated'], backend='bwrap')).stdout.decode().strip())")


@pytest.mark.slow
def test_installs_with_no_dependencies_and_runs_a_box(fresh_venv):
    require_backend("bwrap")
    fresh_venv.install(REPO / "sandbox")
    assert fresh_venv.packages() - {"pip", "setuptools", "wheel"} == {"skyrl-sandbox"}
    doctor = fresh_venv.run("skyrl-sandbox", "doctor")
    assert doctor.returncode == 0 and "backend 'auto' picks: bwrap" in doctor.stdout, doctor.stdout + doctor.stderr
    assert "docker      missing  the docker SDK is not installed" in doctor.stdout  # the extra was not asked for
    ran = fresh_venv.run("python", "-c", RUN_A_BOX)
    assert ran.returncode == 0 and ran.stdout.strip() == "isolated", ran.stderr
