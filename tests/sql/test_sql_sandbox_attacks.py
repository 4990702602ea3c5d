"""SQL-worker attacks, on every backend the sql env runs on (bwrap and subprocess).

Two attackers, both running the real worker program (same mounts, limits, capability drop, seccomp
filter and channel) with changes from ``sql_attack_worker``:
- the guard bypassed: the query guard (SQLite authorizer, DuckDB statement filter) is switched off,
  so the engines' own settings and the sandbox must stop queries that read host files, reach the
  network, load code or write;
- a compromised worker: SQLite functions run Python inside the worker, as an engine exploit would,
  so only the sandbox stands between it and the host: files, the parent's environment, network,
  processes, signals, and the channel to the parent.

The subprocess backend is documented as weaker: it shares the host's files and network, so the file
and network attacks of a compromised worker are contained by bwrap only (those tests say so when
skipped); seccomp, the capability drop, the clean environment and the parent's frame checks hold on
both.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from skyrl_sandbox import get_backend
from skyrl_sql import sandbox as sandbox_module
from skyrl_sql.data.loaders import resolve_database
from skyrl_sql.sandbox import QueryRunner, SandboxSettings, distribution_paths
from skyrl_sql.worker.result import QueryRequest, QueryResult
from sql_helpers import BACKENDS, ENGINES, HAS_DUCKDB, descendants, folder_digest, task

REPO = Path(__file__).resolve().parents[2]
ATTACK_PACKAGE = Path(__file__).resolve().parent / "sql_attack_worker"
SECRET = "HOST-SECRET-7f3a9c"
WEAKER = "the subprocess backend shares the host's files and network (documented as weaker; only bwrap contains this)"
pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def attack_runner(monkeypatch, backend):
    """``attack_runner(engine)``: a runner whose workers are the compromised worker, closed after the test."""
    real_program = sandbox_module.worker_program

    mounts_of: list[str | None] = [None]  # the engine whose mounts the next runner's workers get

    def program(engine: str, roots: tuple[str, ...]):
        base = real_program(mounts_of[0] or engine, roots)
        return dataclasses.replace(base, module="sql_attack_worker.main",
                                   packages={**base.packages, "sql_attack_worker": ATTACK_PACKAGE})

    monkeypatch.setattr(sandbox_module, "worker_program", program)
    runners = []

    def make(engine: str = "sqlite", mounts: str | None = None) -> QueryRunner:
        """``mounts``: start the (SQLite) worker with the mounts of that engine's workers."""
        mounts_of[0] = mounts
        runners.append(QueryRunner(SandboxSettings(backend, engine, workers=1)))
        return runners[-1]

    yield make
    for runner in runners:
        runner.close()


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every database folder holding host secrets: text, CSV, SQLite and DuckDB files."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET)
    (folder / "secret.csv").write_text(f"secret\n{SECRET}\n")
    conn = sqlite3.connect(folder / "secret.sqlite")
    conn.execute("CREATE TABLE t (secret TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", (SECRET,))
    conn.commit()
    conn.close()
    if HAS_DUCKDB:
        import duckdb

        conn = duckdb.connect(str(folder / "secret.duckdb"))
        conn.execute(f"CREATE TABLE t AS SELECT '{SECRET}' AS secret")
        conn.close()
    return folder


@pytest.fixture
def loopback_server():
    """A TCP server on the host's loopback: (port, list of connections it accepted)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(connection)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def database(engine: str) -> Path:
    return resolve_database(task(), engine, None, None)


def ask(runner: QueryRunner, sql: str, engine: str = "sqlite") -> QueryResult:
    return runner.run(QueryRequest(engine, str(database(engine)), sql, 5.0, 100, 1_000_000))


def call(runner: QueryRunner, function: str, *args: object) -> str:
    """What a function of the compromised worker reports ('ok: ...' or 'ExceptionName: ...')."""
    quoted = ", ".join(f"'{arg}'" if isinstance(arg, str) else str(arg) for arg in args)
    result = ask(runner, f"SELECT {function}({quoted})")
    assert result.ok, result
    return result.rows[0][0]


def shown(result: QueryResult) -> str:
    return f"{result.status} {result.message} {result.rows!r}"


# --- the guard bypassed: the engines' own settings and the sandbox hold -----------------------------

SQLITE_WITHOUT_GUARD = [
    ("ATTACH DATABASE '{outside}/secret.sqlite' AS loot", "too many attached databases"),
    ("SELECT load_extension('{outside}/evil.so')", "not authorized"),
    ("CREATE TABLE loot AS SELECT 1 AS a", "readonly"),
    ("PRAGMA query_only = 0", ""),  # allowed without the guard, but the connection is still read-only:
    ("DELETE FROM employees", "readonly"),
]
DUCKDB_WITHOUT_GUARD = [
    "SELECT * FROM read_text('{outside}/secret.txt')",
    "SELECT * FROM read_csv('{outside}/secret.csv')",
    "SELECT * FROM '{outside}/secret.csv'",
    "SELECT * FROM read_text('/proc/{parent}/environ')",
    "ATTACH '{outside}/secret.duckdb' AS loot",
    "SET enable_external_access = true",
    "INSTALL httpfs",
    "LOAD httpfs",
    "COPY (SELECT 42 AS a) TO '{outside}/written.csv'",
    "SELECT * FROM read_csv('http://127.0.0.1:{port}/data.csv')",
]


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_guard_queries_still_cannot_read_write_or_reach_out(attack_runner, engine, outside,
                                                                         loopback_server):
    port, accepted = loopback_server
    runner = attack_runner(engine)
    before = folder_digest(database(engine).parent)
    cases = SQLITE_WITHOUT_GUARD if engine == "sqlite" else [(sql, "") for sql in DUCKDB_WITHOUT_GUARD]
    for template, expected in cases:
        result = ask(runner, template.format(outside=outside, parent=os.getpid(), port=port), engine)
        if template.startswith("PRAGMA"):
            continue
        assert result.status == "error" and expected in result.message, (template, shown(result))
        assert SECRET not in shown(result)
    assert not (outside / "written.csv").exists() and not accepted
    assert folder_digest(database(engine).parent) == before
    assert ask(runner, "SELECT COUNT(*) FROM employees", engine).rows == [(60,)]


# --- a compromised worker: the sandbox holds -------------------------------------------------------

def test_a_compromised_worker_sees_only_the_database_folder_and_its_own_code(attack_runner, backend, outside):
    if backend == "subprocess":
        pytest.skip(WEAKER)
    runner = attack_runner()
    db = database("sqlite")
    assert call(runner, "host_read", str(db)).startswith("ok: SQLite format 3")
    for path in (outside / "secret.txt", REPO / "pyproject.toml", Path(sandbox_module.__file__)):
        assert call(runner, "host_read", str(path)).startswith("FileNotFoundError"), path
    if backend == "bwrap":  # the host's system folders, without its accounts
        for path in (Path.home() / ".bashrc", "/etc/passwd", "/etc/shadow"):
            assert call(runner, "host_read", str(path)).startswith("FileNotFoundError"), path
        assert call(runner, "host_list", "/etc") == "ok: ld.so.cache"
    else:  # a container: the image's own system files, its root-only ones closed to the worker's uid
        for path in (Path.home() / ".bashrc", "/etc/shadow"):
            assert call(runner, "host_read", str(path)).startswith(("FileNotFoundError", "PermissionError")), path
    assert call(runner, "host_list", "/skyrl/lib") == "ok: skyrl_sandbox_runtime,skyrl_sql_worker,sql_attack_worker"
    assert call(runner, "host_list", str(db.parent.parent.parent)) == f"ok: {db.parent.parent.name}"
    assert call(runner, "host_list", str(outside.parent)).startswith("FileNotFoundError")
    for target in (db.parent / "planted.txt", "/tmp/planted.txt"):
        assert not call(runner, "host_read", str(target)).startswith("ok")
    written = call(runner, "host_exec")  # and nothing can run a program that writes for it
    assert written.startswith("PermissionError")
    assert not (db.parent / "planted.txt").exists()


@pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb")
def test_duckdb_workers_see_the_duckdb_distribution_and_no_other_package(attack_runner, backend):
    if backend == "subprocess":
        pytest.skip(WEAKER)
    runner = attack_runner(mounts="duckdb")  # the SQLite functions, with the mounts of a DuckDB worker
    site, entries = distribution_paths("duckdb")
    assert call(runner, "host_list", site) == "ok: " + ",".join(sorted(Path(entry).name for entry in entries))
    assert call(runner, "host_import", "duckdb").startswith(f"ok: {site}/duckdb/")
    for package in ("skyrl_core", "skyrl_sql", "skyrl_sandbox", "pydantic", "numpy"):
        assert call(runner, "host_import", package).startswith("ModuleNotFoundError"), package
    assert call(attack_runner(), "host_import", "duckdb").startswith("ModuleNotFoundError")  # SQLite workers: none


def test_a_compromised_worker_cannot_read_the_parents_environment(attack_runner, backend, monkeypatch):
    monkeypatch.setenv("SKYRL_TEST_API_KEY", SECRET)
    runner = attack_runner()
    own = call(runner, "host_read", "/proc/self/environ")
    assert SECRET not in own and "SKYRL_TEST_API_KEY" not in own  # its own environment is clean on every backend
    parents = call(runner, "host_read", f"/proc/{os.getpid()}/environ")
    if get_backend(backend).strong:  # its own PID namespace: the parent does not exist there
        assert parents.startswith("FileNotFoundError"), parents
        for pid in (os.getppid(), 1):
            assert SECRET not in call(runner, "host_read", f"/proc/{pid}/environ")
    elif os.geteuid() == 0:  # the worker dropped the capabilities its root parent holds: ptrace access is refused
        assert parents.startswith("PermissionError"), parents
    else:
        pytest.skip(f"{WEAKER}: a worker of a parent without capabilities may read the parent's /proc files")


def test_a_compromised_worker_has_no_network(attack_runner, backend, loopback_server):
    if backend == "subprocess":
        pytest.skip(WEAKER)
    port, accepted = loopback_server
    runner = attack_runner()
    outcome = call(runner, "host_connect", "127.0.0.1", port)
    assert not outcome.startswith("ok") and not accepted, outcome
    assert not call(runner, "host_connect", "1.1.1.1", 53).startswith("ok")


def test_a_compromised_worker_cannot_start_processes_or_signal_the_parent(attack_runner, backend):
    runner = attack_runner()
    assert call(runner, "host_fork").startswith("PermissionError")
    assert call(runner, "host_exec").startswith("PermissionError")
    assert call(runner, "host_signal", os.getpid()).startswith("PermissionError")
    status = call(runner, "host_read", "/proc/self/status")
    assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    for held in ("CapEff", "CapPrm", "CapBnd"):
        assert f"{held}:\t0000000000000000" in status
    (pid,) = runner.worker_pids()
    assert call(runner, "host_read", "/proc/self/status") and runner.worker_pids() == [pid]  # still serving
    cgroups = Path(f"/proc/{descendants(pid)[-1]}/cgroup").read_text()
    from skyrl_sandbox.cgroups import cgroup_support

    if get_backend(backend).engine is None and cgroup_support() is not None:  # a container: the engine's own groups
        assert "skyrl-sandbox-" in cgroups


@pytest.mark.parametrize("kind", ["oversized", "other_id", "not_json", "not_an_object", "nested"])
def test_forged_and_oversized_frames_are_rejected_and_the_worker_replaced(attack_runner, kind):
    runner = attack_runner()
    ask(runner, "SELECT 1")  # the worker's first query: id 1
    (pid,) = runner.worker_pids()
    result = ask(runner, f"SELECT host_frame('{kind}', 2)")
    assert result.status == "crashed" and "invalid reply" in result.message, shown(result)
    assert "FORGED" not in shown(result)
    assert ask(runner, "SELECT 3").rows == [(3,)]
    assert runner.worker_pids() != [pid]


@pytest.mark.parametrize("kind", ["current", "later"])
def test_an_extra_frame_never_answers_a_later_query(attack_runner, kind):
    runner = attack_runner()
    first = ask(runner, f"SELECT host_frame('{kind}', 1)")
    # A compromised worker answers for the query it runs (nothing outside can check that) ...
    assert first.rows == ([("FORGED",)] if kind == "current" else [("ok: later",)])
    (pid,) = runner.worker_pids()
    time.sleep(0.5)  # the late frame is in the pipe by now
    # ... but the frame left over is noticed before the next query, whose worker is a fresh one.
    assert ask(runner, "SELECT 2").rows == [(2,)]
    assert runner.worker_pids() != [pid]


def test_a_result_over_the_channel_cap_is_cut_inside_the_worker(backend):
    runner = QueryRunner(SandboxSettings(backend, workers=1, max_message_mb=1))
    try:
        sql = "SELECT hex(randomblob(500)) FROM employees a, employees b"  # 3,600 rows, about 3.6 MB of JSON
        result = runner.run(QueryRequest("sqlite", str(database("sqlite")), sql, 5.0, 10_000, 16_000_000))
        assert result.ok and result.cut == "bytes" and 0 < len(result.rows) < 3600
        assert sum(len(row[0]) for row in result.rows) < 2**20
    finally:
        runner.close()
