"""Third parties can publish plugins: the tutorial plugin, pip-installed with skyrl-core into a fresh
virtual environment, shows up in `skyrl envs` and passes `skyrl check`; core pulls in no DL stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tutorial_plugin_installs_into_a_fresh_venv_and_passes_check(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(REPO / "core"), str(REPO / "examples" / "reverse_text")], check=True, timeout=600)

    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert {"skyrl-core", "skyrl-reverse-text"} <= names
    assert not names & {"torch", "transformers", "vllm", "tokenizers"}

    skyrl = str(venv / "bin" / "skyrl")
    envs = json.loads(subprocess.run([skyrl, "envs", "--json"], capture_output=True, text=True, check=True).stdout)
    assert [(e["id"], e["provider"]) for e in envs] == [("reverse_text", "skyrl-reverse-text")]
    check = subprocess.run([skyrl, "check", "reverse_text"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
