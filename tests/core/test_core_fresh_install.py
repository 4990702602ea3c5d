"""Third parties can publish plugins: the tutorial plugin, pip-installed with skyrl-core into a fresh
virtual environment, shows up in `skyrl envs` and passes `skyrl check`; core pulls in no DL stack."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tutorial_plugin_installs_into_a_fresh_venv_and_passes_check(fresh_venv):
    fresh_venv.install(REPO / "core", REPO / "examples" / "reverse_text")
    packages = fresh_venv.packages()
    assert {"skyrl-core", "skyrl-reverse-text"} <= packages
    assert not packages & {"torch", "transformers", "vllm", "tokenizers"}
    envs = fresh_venv.skyrl_json("envs")
    assert [(e["id"], e["provider"]) for e in envs] == [("reverse_text", "skyrl-reverse-text")]
    check = fresh_venv.skyrl("check", "reverse_text")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
