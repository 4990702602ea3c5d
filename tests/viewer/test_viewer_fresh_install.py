"""skyrl-viewer installs with only skyrl-core into a fresh venv (no deep-learning stack) and exports a page."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_viewer_api import write_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_viewer_installs_alone_with_core_and_exports(fresh_venv, tmp_path):
    fresh_venv.install(REPO / "core", REPO / "viewer")
    packages = fresh_venv.packages()
    assert {"skyrl-core", "skyrl-viewer", "plotly"} <= packages
    assert not packages & {"torch", "transformers", "vllm", "skyrl-trainers"}
    listed = fresh_venv.skyrl("plugins")
    assert listed.returncode == 0 and '"name": "skyrl-viewer"' in listed.stdout
    out = tmp_path / "run.html"
    done = fresh_venv.skyrl("view", str(write_run(tmp_path / "run")), "--export", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "window.SKYRL_EXPORT" in out.read_text() and "plotly.js v" in out.read_text()
