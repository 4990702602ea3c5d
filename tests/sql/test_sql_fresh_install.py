"""skyrl-sql installs beside skyrl-core and skyrl-sandbox alone (no DuckDB, no DL stack) and passes `skyrl check sql`."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_skyrl_sql_installs_alone_with_core_and_passes_check(fresh_venv, tmp_path):
    fresh_venv.install(REPO / "core", REPO / "sandbox", REPO / "plugins" / "sql")
    packages = fresh_venv.packages()
    assert {"skyrl-core", "skyrl-sandbox", "skyrl-sql"} <= packages
    assert not packages & {"torch", "transformers", "duckdb", "pandas"}

    env = {"SKYRL_SQL_CACHE": str(tmp_path / "cache"), "SKYRL_LOAD_PLUGINS": "skyrl-sql"}
    listed = fresh_venv.skyrl_json("envs", env=env)
    assert [(e["id"], e["provider"]) for e in listed] == [("sql", "skyrl-sql")]
    check = fresh_venv.skyrl("check", "sql", "--n-tasks", "4", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 failed" in check.stdout
    duck = fresh_venv.skyrl("check", "sql", "env.engine=duckdb", env=env)
    assert duck.returncode != 0
    assert "env.engine: Value error, engine 'duckdb' needs the duckdb package: pip install duckdb" in duck.stderr
