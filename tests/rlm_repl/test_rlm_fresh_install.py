"""skyrl-rlm-repl installs with only skyrl-core into a fresh venv (no DL stack) and passes `skyrl check`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_plugin_installs_alone_with_core_lists_its_components_and_passes_check(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(REPO / "core"), str(REPO / "plugins" / "rlm_repl")], check=True, timeout=600)

    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert {"skyrl-core", "skyrl-rlm-repl"} <= names
    assert not names & {"torch", "transformers", "vllm"}

    skyrl = str(venv / "bin" / "skyrl")
    envs = json.loads(subprocess.run([skyrl, "envs", "--json"], capture_output=True, text=True, check=True).stdout)
    assert [(e["id"], e["provider"]) for e in envs] == [("rlm_repl", "skyrl-rlm-repl")]
    generators = subprocess.run([skyrl, "generators", "--json"], capture_output=True, text=True, check=True).stdout
    assert "rlm_tree" in {g["id"] for g in json.loads(generators)}
    check = subprocess.run([skyrl, "check", "rlm_repl"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
    made = subprocess.run([str(venv / "bin" / "skyrl-rlm-make-dataset"), "--help"], capture_output=True, text=True)
    assert made.returncode == 0 and "PAPERS_DIR" in made.stdout.upper()
