"""Hostile queries: each is refused or stopped with the promised observation, and the database
files stay byte-identical (no journal or WAL file appears either)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

import pytest
from skyrl_sandbox.pool import SPAWNER
from skyrl_sql.sandbox import START_TIMEOUT_S, QueryRunner, SandboxError, SandboxSettings
from skyrl_sql.worker.result import QueryRequest
from sql_helpers import BACKENDS, ENGINES, HAS_DUCKDB, PROCESS_BACKENDS, descendants, folder_digest, query, started_env

FOREVER = {
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n",
    "duckdb": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n",
}
# 60 employees ** 4 = about 13 million rows.
MILLIONS = "SELECT a.id, b.id, c.id, d.id FROM employees a, employees b, employees c, employees d"

SHARED = [
    ("INSERT INTO departments VALUES (99, 'Evil', 'Nowhere')", "Refused: INSERT"),
    ("UPDATE employees SET salary = 0", "Refused: UPDATE"),
    ("DELETE FROM employees", "Refused: DELETE"),
    ("DROP TABLE employees", "Refused:"),
    ("CREATE TABLE loot AS SELECT * FROM employees", "Refused:"),
    ("ALTER TABLE employees ADD COLUMN x INTEGER", "Refused:"),
    ("ATTACH DATABASE 'other.db' AS other", "Refused: ATTACH"),
    ("BEGIN TRANSACTION", "Refused:"),
]
SQLITE_ONLY = [
    ("PRAGMA journal_mode = WAL", "Refused: PRAGMA journal_mode"),
    ("PRAGMA user_version = 7", "Refused: PRAGMA user_version"),
    ("PRAGMA query_only = 0", "Refused: PRAGMA query_only"),
    ("PRAGMA writable_schema = 1", "Refused: PRAGMA writable_schema"),
    ("SELECT load_extension('/tmp/evil.so')", "Refused: the function load_extension()"),
    ("VACUUM INTO 'copy.db'", "Refused:"),
    ("REINDEX", "Refused: REINDEX statements are not allowed."),
    ("SELECT 1; DROP TABLE employees", "Error executing SQL: You can only execute one statement at a time"),
]
DUCKDB_ONLY = [
    ("SET enable_external_access = true", "Refused: SET"),
    ("PRAGMA enable_profiling", "Refused: PRAGMA enable_profiling"),
    ("INSTALL httpfs", "Refused: INSTALL"),
    ("LOAD '/tmp/evil.duckdb_extension'", "Refused: LOAD"),
    ("COPY employees TO 'stolen.csv'", "Refused: COPY"),
    ("EXPORT DATABASE 'dump'", "Refused: EXPORT"),
    ("SELECT * FROM read_csv('/etc/passwd')", "file system operations are disabled"),
    ("CHECKPOINT", "Refused:"),
    ("SELECT 1; DROP TABLE employees", "Error executing SQL: write exactly one statement per query, got 2"),
]
CASES = ([("sqlite", s, e) for s, e in SHARED + SQLITE_ONLY]
         + [pytest.param("duckdb", s, e, marks=pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb"))
            for s, e in SHARED + DUCKDB_ONLY])


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize(("engine", "sql", "expected"), CASES)
def test_writes_and_escapes_are_refused_and_leave_the_database_identical(engine, sql, expected, backend):
    env = started_env(engine, sandbox=backend)
    folder = env.database().parent
    before = folder_digest(folder)
    text = query(env, sql)
    assert expected in text
    assert folder_digest(folder) == before
    # The connection is still usable and the data intact.
    assert "60" in query(env, "SELECT COUNT(*) FROM employees")


@pytest.mark.parametrize(("sql", "name"), [
    ("REINDEX", "REINDEX"), ("reindex employees", "REINDEX"), ("  ReIndex NOCASE", "REINDEX"),
    ("VACUUM", "VACUUM"), ("vacuum main", "VACUUM"), ("\n\tVACUUM INTO 'copy.db'", "VACUUM"),
    ("ANALYZE", "ANALYZE"), ("/* statistics */ analyze employees", "ANALYZE"), ("-- refresh\n  Analyze main", "ANALYZE"),
])
def test_sqlite_maintenance_statements_are_refused_by_name(sql, name):
    text = query(started_env("sqlite"), sql)
    assert f"Refused: {name} statements are not allowed. The database is read-only" in text


@pytest.mark.timeout(120)  # a query that was not stopped would hold the test until here
@pytest.mark.parametrize("engine", ENGINES)
def test_a_query_that_runs_forever_is_stopped_at_the_time_limit(engine):
    env = started_env(engine, query_timeout_s=0.5)
    before = folder_digest(env.database().parent)
    text = query(env, FOREVER[engine])
    assert "SQL Timeout: the query ran longer than 0.5 s and was stopped." in text
    assert folder_digest(env.database().parent) == before
    assert env.get_metrics()["execution_errors"] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cross_join_of_millions_of_rows_is_cut_at_the_row_cap(engine):
    env = started_env(engine, max_rows=1000)
    before = folder_digest(env.database().parent)
    text = query(env, MILLIONS)
    assert "Row limit hit: the query returned more than 1,000 rows and was cut off." in text
    assert "Showing the first 50 of 1,000+ rows." in text
    assert text.count("\n") < 70  # header + 50 rows + notes, not millions
    assert folder_digest(env.database().parent) == before


@pytest.mark.parametrize("engine", ENGINES)
def test_huge_values_are_cut_at_the_size_cap(engine):
    wide = ("replace(hex(zeroblob(50000)), '00', 'xx')" if engine == "sqlite" else "repeat('x', 100000)")
    env = started_env(engine, max_result_bytes=1_000_000)
    text = query(env, f"SELECT {wide} FROM employees")
    assert "Size limit hit: the result exceeded 1,000,000 bytes and was cut off after 9 rows." in text
    assert len(text) < 12_000  # the observation itself stays within max_observation_chars


def test_sqlite_refuses_a_single_value_over_the_size_cap():
    env = started_env("sqlite", max_result_bytes=100_000)
    assert "Error executing SQL: string or blob too big" in query(env, "SELECT randomblob(10000000)")


def _sleep_request(db_path: str, timeout_s: float) -> QueryRequest:
    return QueryRequest("sqlite", db_path, FOREVER["sqlite"], timeout_s, 10, 100_000)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_frozen_sandbox_process_is_killed_and_replaced(backend):
    env = started_env("sqlite")
    db = str(env.database())
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        assert runner.run(QueryRequest("sqlite", db, "SELECT 1", 5.0, 10, 1000)).rows == [(1,)]
        (pid,) = runner.worker_pids()
        os.kill(descendants(pid)[-1], signal.SIGSTOP)  # the Python worker can no longer stop its own query
        result = runner.run(_sleep_request(db, 0.3))
        assert result.status == "timeout" and "stopped" in result.message
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
        assert runner.run(QueryRequest("sqlite", db, "SELECT 2", 5.0, 10, 1000)).rows == [(2,)]
        assert runner.worker_pids() != [pid]
    finally:
        runner.close()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _exited(pid: int) -> bool:
    """Whether ``pid`` is a zombie, or gone (a container's init is reaped by its shim, not by us)."""
    try:
        return _state(pid) == "Z"
    except (FileNotFoundError, ProcessLookupError):  # its /proc entry went away, or is going
        return True


def _freeze_processes_started_since(known: set[int]) -> set[int]:
    """SIGSTOP every process below this one that is not in ``known``, and any they start meanwhile."""
    frozen: set[int] = set()
    while started := set(descendants(os.getpid())) - known - frozen:
        for process in started:
            os.kill(process, signal.SIGSTOP)
        frozen |= started
        while any(_state(process) not in "tT" for process in frozen):
            time.sleep(0.01)
    return frozen


@pytest.mark.timeout(START_TIMEOUT_S - 10)  # a query that waited for the spare to start would fail here
@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_a_frozen_spare_worker_never_holds_a_query_past_its_time_limit(backend):
    db = str(started_env("sqlite").database())
    SPAWNER.submit(int).result()  # no worker of an earlier test is still being started
    before = set(descendants(os.getpid()))
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        assert runner.run(QueryRequest("sqlite", db, "SELECT 1", 5.0, 10, 1000)).rows == [(1,)]
        SPAWNER.submit(int).result()  # the spare kept for the next worker has been started
        (pid,) = runner.worker_pids()
        spare = _freeze_processes_started_since(before | set(descendants(pid)))
        assert spare
        os.kill(pid, signal.SIGKILL)  # the started worker is gone: the next query must take the spare
        while _state(pid) != "Z":
            time.sleep(0.01)
        result = runner.run(QueryRequest("sqlite", db, "SELECT 2", 1.0, 10, 1000))
        assert (result.status, result.message) == ("timeout", "the query ran longer than 1 s and was stopped.")
        assert runner.run(QueryRequest("sqlite", db, "SELECT 3", 5.0, 10, 1000)).rows == [(3,)]
        assert not spare & set(runner.worker_pids())
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_sandbox_process_that_dies_mid_query_gives_crashed_and_is_replaced(backend):
    env = started_env("sqlite")
    db = str(env.database())
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        runner.run(QueryRequest("sqlite", db, "SELECT 1", 5.0, 10, 1000))
        (pid,) = runner.worker_pids()
        threading.Timer(0.3, os.kill, (descendants(pid)[-1], signal.SIGKILL)).start()
        result = runner.run(_sleep_request(db, 10.0))
        assert result.status == "crashed"
        assert "the query crashed the database process (it was terminated by SIGKILL (killed))" in result.message
        assert runner.run(QueryRequest("sqlite", db, "SELECT 3", 5.0, 10, 1000)).rows == [(3,)]
    finally:
        runner.close()


HUGE_SORT = ("SELECT a.name || b.name || c.name || d.name AS s FROM employees a, employees b, employees c, "
             "employees d ORDER BY s DESC")  # sorting ~13 million strings needs far more memory than allowed


def test_a_memory_hungry_query_fails_inside_the_sandbox_not_the_trainer():
    env = started_env("sqlite", memory_limit_mb=256, query_timeout_s=30)
    text = query(env, HUGE_SORT)
    assert "SQL Crashed: the query needed more memory than the limit and was stopped." in text
    assert "60" in query(env, "SELECT COUNT(*) FROM employees")


@pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb")
def test_duckdb_memory_limit_gives_an_out_of_memory_error():
    env = started_env("duckdb", memory_limit_mb=512, query_timeout_s=30)
    text = query(env, HUGE_SORT)
    assert "Error executing SQL: Out of Memory Error" in text
    assert "60" in query(env, "SELECT COUNT(*) FROM employees")


def test_bwrap_workers_have_no_network_and_their_own_mounts(require_bwrap):
    runner = QueryRunner(SandboxSettings("bwrap", workers=1))
    try:
        assert runner.run(QueryRequest("sqlite", str(started_env().database()), "SELECT 1", 5.0, 10, 1000)).ok
        (pid,) = runner.worker_pids()
        python = descendants(pid)[-1]
        assert "skyrl_sql_worker.main" in Path(f"/proc/{python}/cmdline").read_text()
        for namespace in ("net", "mnt", "pid"):
            assert os.readlink(f"/proc/{python}/ns/{namespace}") != os.readlink(f"/proc/self/ns/{namespace}")
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_sandbox_processes_do_not_inherit_the_trainers_secrets(monkeypatch, backend):
    monkeypatch.setenv("SKYRL_TEST_SECRET", "hunter2")
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        runner.run(QueryRequest("sqlite", str(started_env().database()), "SELECT 1", 5.0, 10, 1000))
        (pid,) = runner.worker_pids()
        for process in descendants(pid):
            environ = open(f"/proc/{process}/environ", "rb").read().decode(errors="replace")
            assert "SKYRL_TEST_SECRET" not in environ and "hunter2" not in environ
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_workers_outlive_the_thread_that_started_them(backend):
    # Env steps run on short-lived threads; bubblewrap ties a sandbox's life to its starting thread.
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    request = QueryRequest("sqlite", str(started_env().database()), "SELECT 1", 5.0, 10, 1000)
    try:
        starter = threading.Thread(target=runner.run, args=(request,))
        starter.start()
        starter.join()
        time.sleep(0.3)
        (pid,) = runner.worker_pids()
        assert Path(f"/proc/{pid}").exists()
        assert runner.run(request).rows == [(1,)]
        assert runner.worker_pids() == [pid]
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_wal_mode_database_is_read_without_creating_files_beside_it(tmp_path, backend):
    db = tmp_path / "wal" / "wal.sqlite"
    db.parent.mkdir()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.execute("INSERT INTO t VALUES (7)")
    conn.commit()
    conn.close()
    before = folder_digest(db.parent)
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        assert runner.run(QueryRequest("sqlite", str(db), "SELECT a FROM t", 5.0, 10, 1000)).rows == [(7,)]
        refused = runner.run(QueryRequest("sqlite", str(db), "DELETE FROM t", 5.0, 10, 1000))
        assert refused.status == "refused"
    finally:
        runner.close()
    assert folder_digest(db.parent) == before == {"wal.sqlite": before["wal.sqlite"]}


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_database_in_roots_home_is_read_on_every_backend(backend):
    """A run as root keeps the built-in databases in ``/root/.cache``; docker's image closes ``/root`` to its uid."""
    if os.geteuid() != 0:
        pytest.skip("needs to run as root, whose home is /root")
    folder = Path(tempfile.mkdtemp(prefix="skyrl-sql-test-", dir="/root"))
    try:
        folder.chmod(0o755)
        db = folder / "home.sqlite"
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE t (a INTEGER)")
            conn.execute("INSERT INTO t VALUES (42)")
        conn.close()
        db.chmod(0o644)
        runner = QueryRunner(SandboxSettings(backend, workers=1))
        try:
            assert runner.run(QueryRequest("sqlite", str(db), "SELECT a FROM t", 5.0, 10, 1000)).rows == [(42,)]
        finally:
            runner.close()
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_frozen_worker_cannot_block_the_trainer_on_a_full_pipe(backend):
    db = str(started_env("sqlite").database())
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        runner.run(QueryRequest("sqlite", db, "SELECT 1", 5.0, 10, 1000))
        (pid,) = runner.worker_pids()
        os.kill(descendants(pid)[-1], signal.SIGSTOP)
        huge = "SELECT 1 -- " + "x" * 2_000_000  # far more than a pipe holds: the write itself would block
        result = runner.run(QueryRequest("sqlite", db, huge, 0.3, 10, 1000))
        assert result.status == "timeout"
        assert runner.run(QueryRequest("sqlite", db, "SELECT 4", 5.0, 10, 1000)).rows == [(4,)]
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_database_that_cannot_be_opened_is_an_infrastructure_error_and_the_worker_stays(tmp_path, backend):
    tmp_path.chmod(0o755)  # docker workers run as a uid of their own
    good = str(tmp_path / "good.sqlite")
    sqlite3.connect(good).close()
    bad = tmp_path / "bad.sqlite"  # in the same folder, so the worker sees both
    bad.write_bytes(b"this is not a database" * 100)
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        runner.run(QueryRequest("sqlite", good, "SELECT 1", 5.0, 10, 1000))
        (pid,) = runner.worker_pids()
        with pytest.raises(SandboxError, match=f"cannot open sqlite database {bad}: DatabaseError: file is not a"):
            runner.run(QueryRequest("sqlite", str(bad), "SELECT 1", 5.0, 10, 1000))
        with pytest.raises(SandboxError, match="the file does not exist"):
            runner.run(QueryRequest("sqlite", str(tmp_path / "absent.sqlite"), "SELECT 1", 5.0, 10, 1000))
        assert runner.run(QueryRequest("sqlite", good, "SELECT 5", 5.0, 10, 1000)).rows == [(5,)]
        assert pid in runner.worker_pids()
    finally:
        runner.close()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_a_worker_killed_between_queries_is_replaced_without_a_crash_for_the_next_query(backend):
    """The killed worker's main thread is a zombie before its other threads have exited: it cannot be
    reaped yet and its channel is still open, so a query sent to it would seem to have crashed it."""
    db = str(started_env("sqlite").database())
    runner = QueryRunner(SandboxSettings(backend, workers=1))
    try:
        for number in range(1, 9):
            assert runner.run(QueryRequest("sqlite", db, f"SELECT {number}", 5.0, 10, 1000)).rows == [(number,)]
            (pid,) = runner.worker_pids()
            os.kill(pid, signal.SIGKILL)
            while not _exited(pid):
                time.sleep(0.001)
        assert runner.run(QueryRequest("sqlite", db, "SELECT 9", 5.0, 10, 1000)).rows == [(9,)]
    finally:
        runner.close()
