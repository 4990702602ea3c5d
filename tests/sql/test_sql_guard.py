"""What the query guard tells the model: a refusal names the statement the model wrote, no query
shows where the database lives on the host, and the schema PRAGMAs work on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from skyrl_sql.sandbox import QueryRunner, SandboxSettings
from skyrl_sql.worker.result import QueryRequest
from sql_helpers import ENGINES, HAS_DUCKDB, query, started_env

needs_duckdb = pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb")


def statements(kind: str) -> str:
    return f"Refused: {kind} statements are not allowed."


# SQLite's authorizer sees VACUUM as an ATTACH and ANALYZE or CREATE as a write to its schema table;
# DuckDB parses ANALYZE as VACUUM, INSTALL as LOAD, CHECKPOINT as CALL. The refusal names what was written.
NAMED = {
    "VACUUM": statements("VACUUM"),
    "/* tidy up */ VACUUM": statements("VACUUM"),
    "ANALYZE": statements("ANALYZE"),
    "-- fresh statistics\nANALYZE employees": statements("ANALYZE"),
    "CREATE TABLE loot (a INTEGER)": statements("CREATE"),
    "CREATE INDEX by_name ON employees (name)": statements("CREATE"),
    "CREATE VIEW rich AS SELECT * FROM employees": statements("CREATE"),
    "DROP TABLE employees": statements("DROP"),
    "ALTER TABLE employees ADD COLUMN x INTEGER": statements("ALTER"),
    "INSERT INTO departments VALUES (99, 'Evil', 'Nowhere')": statements("INSERT"),
    "UPDATE employees SET salary = 0": statements("UPDATE"),
    "DELETE FROM employees": statements("DELETE"),
    "WITH gone AS (SELECT 1) DELETE FROM employees": statements("DELETE"),
    "ATTACH DATABASE 'other.db' AS other": statements("ATTACH"),
    "DETACH DATABASE other": statements("DETACH"),
    "BEGIN TRANSACTION": statements("BEGIN"),
    "COMMIT": statements("COMMIT"),
    "PRAGMA database_list": "Refused: PRAGMA database_list is not allowed.",
}
SQLITE_NAMED = {
    "VACUUM INTO 'copy.db'": statements("VACUUM"),
    "SAVEPOINT s": statements("SAVEPOINT"),
    "RELEASE s": statements("RELEASE"),
    "REPLACE INTO departments VALUES (99, 'Evil', 'Nowhere')": statements("REPLACE"),
    "CREATE TRIGGER t AFTER INSERT ON employees BEGIN SELECT 1; END": statements("CREATE"),
    "PRAGMA journal_mode = WAL": "Refused: PRAGMA journal_mode = WAL is not allowed.",
    "SELECT * FROM pragma_compile_options": "Refused: PRAGMA compile_options is not allowed.",
    "SELECT load_extension('/tmp/evil.so')": "Refused: the function load_extension() is not allowed.",
}
DUCKDB_NAMED = {
    "INSTALL httpfs": statements("INSTALL"),
    "FORCE INSTALL httpfs": statements("FORCE INSTALL"),
    "LOAD httpfs": statements("LOAD"),
    "CHECKPOINT": statements("CHECKPOINT"),
    "SET threads = 4": statements("SET"),
    "RESET threads": statements("RESET"),
    "USE company": statements("USE"),
    "TRUNCATE employees": statements("TRUNCATE"),
    "COMMENT ON TABLE employees IS 'x'": statements("COMMENT"),
    "COPY employees TO 'stolen.csv'": statements("COPY"),
    "EXPORT DATABASE 'dump'": statements("EXPORT"),
    "IMPORT DATABASE 'dump'": statements("IMPORT"),
    "CALL pragma_version()": statements("CALL"),
    "EXPLAIN SELECT 1": statements("EXPLAIN"),
    "PRAGMA enable_profiling": "Refused: PRAGMA enable_profiling is not allowed.",
}
NAMED_CASES = ([pytest.param("sqlite", sql, expected, id=f"sqlite-{sql}") for sql, expected in {**NAMED, **SQLITE_NAMED}.items()]
               + [pytest.param("duckdb", sql, expected, id=f"duckdb-{sql}", marks=needs_duckdb)
                  for sql, expected in {**NAMED, **DUCKDB_NAMED}.items()])


@pytest.mark.parametrize(("engine", "sql", "expected"), NAMED_CASES)
def test_a_refusal_names_the_statement_that_was_refused(engine, sql, expected):
    text = query(started_env(engine), sql)
    assert text.startswith(f"\n<observation>{expected} ")


# Every route to the DuckDB file's path: catalog functions and views, settings (allowed_paths lists
# the file), wrappers around them, and functions that run SQL given as text.
PATH_ROUTES = {
    "SELECT * FROM duckdb_databases()": "duckdb_databases",
    "SELECT path FROM duckdb_databases": "duckdb_databases",
    "FROM system.main.duckdb_databases": "duckdb_databases",
    'SELECT * FROM "DUCKDB_DATABASES"()': "duckdb_databases",
    "WITH d AS (FROM duckdb_databases()) SELECT path FROM d": "duckdb_databases",
    "SELECT count(*) FROM employees WHERE (SELECT max(path) FROM duckdb_databases()) LIKE '/tmp%'": "duckdb_databases",
    "SUMMARIZE SELECT * FROM duckdb_databases()": "duckdb_databases",
    "SUMMARIZE duckdb_databases": "duckdb_databases",
    "SELECT file FROM pragma_database_list": "pragma_database_list",
    "SELECT value FROM duckdb_settings() WHERE name = 'allowed_paths'": "duckdb_settings",
    "SELECT setting FROM pg_settings": "pg_settings",
    "SELECT * FROM pg_catalog.pg_settings": "pg_settings",
    "SELECT current_setting('allowed_paths')": "current_setting",
    "SELECT 'allowed_paths'.current_setting()": "current_setting",
    "SELECT list_transform([1], x -> current_setting('allowed_' || 'paths'))": "current_setting",
    "SELECT * FROM query('SELECT path FROM duckdb_databases()')": "query",
    "SELECT * FROM query_table('duckdb_databases')": "query_table",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT path FROM duckdb_databases()'))":
        "json_execute_serialized_sql",
}


def _assert_no_path(text: str, db: Path) -> None:
    assert str(db.parent) not in text and db.name not in text


@needs_duckdb
@pytest.mark.parametrize(("sql", "name"), PATH_ROUTES.items(), ids=list(PATH_ROUTES))
def test_duckdb_refuses_every_route_to_the_database_path(sql, name):
    env = started_env("duckdb")
    text = query(env, sql)
    assert f"Refused: {name} is not allowed: " in text
    _assert_no_path(text, env.database())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sql", ["PRAGMA database_list", "CALL duckdb_databases()",
                                 "SELECT * FROM pragma_database_list", "SELECT * FROM pragma_database_list()",
                                 "SELECT * FROM duc\u212adb_databases()"])  # a Kelvin sign for the K
def test_other_routes_to_the_path_are_refused_or_fail(engine, sql):
    env = started_env(engine)
    text = query(env, sql)
    assert "Refused:" in text or "Error executing SQL:" in text
    _assert_no_path(text, env.database())


@needs_duckdb
def test_no_duckdb_catalog_function_view_or_setting_shows_the_path():
    import duckdb

    catalog = duckdb.connect()
    functions = catalog.execute("SELECT DISTINCT function_name, function_type, len(parameters) FROM duckdb_functions() "
                                "WHERE function_type IN ('table', 'table_macro', 'scalar', 'macro')").fetchall()
    settings = [name for (name,) in catalog.execute("SELECT name FROM duckdb_settings()").fetchall()]
    views = catalog.execute("SELECT schema_name, view_name FROM duckdb_views() WHERE internal").fetchall()
    catalog.close()
    sqls = [f'SELECT * FROM "{name}"({"" if n == 0 else "$$employees$$"})' for name, kind, n in functions
            if kind.startswith("table") and n <= 1]
    sqls += [f'SELECT "{name}"()' for name, kind, n in functions if not kind.startswith("table") and n == 0]
    sqls += [f"SELECT current_setting('{name}')" for name in settings]
    sqls += [f'SELECT * FROM "{schema}"."{name}"' for schema, name in views]
    assert len(sqls) > 300
    db = started_env("duckdb").database()
    runner = QueryRunner(SandboxSettings("subprocess", "duckdb", workers=1))
    try:
        for sql in sqls:
            result = runner.run(QueryRequest("duckdb", str(db), sql, 5.0, 1000, 1_000_000))
            shown = f"{result.message} {result.rows!r}"
            assert str(db.parent) not in shown and db.name not in shown, (sql, shown[:300])
    finally:
        runner.close()


SCHEMA_PRAGMAS = ["PRAGMA table_info(employees)", "PRAGMA table_info('employees')",
                  "SELECT * FROM pragma_table_info('employees')",
                  "SELECT name, type FROM pragma_table_info('employees') ORDER BY cid"]
COLUMNS = ["id", "name", "dept_id", "salary", "hire_year", "manager_id"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("sql", SCHEMA_PRAGMAS)
def test_schema_pragmas_return_the_columns(engine, sql):
    text = query(started_env(engine), sql)
    rows = text.split("\n")[2:2 + len(COLUMNS)]  # after the header line: one row per column
    assert [next(word for word in row.split() if word in COLUMNS) for row in rows] == COLUMNS


def test_sqlite_schema_pragma_functions_work_after_a_refused_pragma():
    env = started_env("sqlite")
    assert "Refused: PRAGMA database_list" in query(env, "SELECT * FROM pragma_database_list")
    assert "departments" in query(env, "SELECT \"table\" FROM pragma_foreign_key_list('employees')")
    assert "manager_id" in query(env, "SELECT name FROM pragma_table_xinfo('employees')")
