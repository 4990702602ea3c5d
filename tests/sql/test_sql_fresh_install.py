"""skyrl-sql installs beside skyrl-core alone (no DuckDB, no DL stack) and passes `skyrl check sql`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_skyrl_sql_installs_alone_with_core_and_passes_check(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(REPO / "core"), str(REPO / "plugins" / "sql")], check=True, timeout=600)

    installed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                               check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert {"skyrl-core", "skyrl-sql"} <= names
    assert not names & {"torch", "transformers", "duckdb", "pandas"}

    env = {**os.environ, "SKYRL_SQL_CACHE": str(tmp_path / "cache"), "SKYRL_LOAD_PLUGINS": "skyrl-sql"}
    skyrl = str(venv / "bin" / "skyrl")
    listed = json.loads(subprocess.run([skyrl, "envs", "--json"], capture_output=True, text=True, check=True,
                                       env=env).stdout)
    assert [(e["id"], e["provider"]) for e in listed] == [("sql", "skyrl-sql")]
    check = subprocess.run([skyrl, "check", "sql", "--n-tasks", "4"], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
    duck = subprocess.run([skyrl, "check", "sql", "env.engine=duckdb"], capture_output=True, text=True, env=env)
    assert duck.returncode != 0 and "env.engine: Value error, engine 'duckdb' needs the duckdb package: pip install duckdb" in duck.stderr
