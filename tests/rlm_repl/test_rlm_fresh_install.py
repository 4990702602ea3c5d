"""skyrl-rlm-repl installs with only skyrl-core and skyrl-sandbox into a fresh venv (no DL stack), passes `skyrl check`."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_plugin_installs_alone_with_core_lists_its_components_and_passes_check(fresh_venv):
    fresh_venv.install(REPO / "core", REPO / "sandbox", REPO / "plugins" / "rlm_repl")
    packages = fresh_venv.packages()
    assert {"skyrl-core", "skyrl-sandbox", "skyrl-rlm-repl"} <= packages
    assert not packages & {"torch", "transformers", "vllm"}
    envs = fresh_venv.skyrl_json("envs")
    assert [(e["id"], e["provider"]) for e in envs] == [("rlm_repl", "skyrl-rlm-repl")]
    assert "rlm_tree" in {g["id"] for g in fresh_venv.skyrl_json("generators")}
    check = fresh_venv.skyrl("check", "rlm_repl")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
    made = fresh_venv.run("skyrl-rlm-make-dataset", "--help")
    assert made.returncode == 0 and "PAPERS_DIR" in made.stdout.upper()
