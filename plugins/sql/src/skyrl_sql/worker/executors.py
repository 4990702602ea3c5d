"""Run one query on a read-only SQLite or DuckDB connection with a time limit and row/size caps.

This module runs inside the sandbox worker (:mod:`skyrl_sql.worker.main`); the trainer process never
executes model-written SQL itself.
"""

from __future__ import annotations

import datetime
import decimal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .guard import READ_ONLY_HINT, SQLiteGuard, declare_pragma_functions, duckdb_refusal, sqlite_statement_refusal
from .result import QueryRequest, QueryResult

_PROGRESS_EVERY = 5_000  # SQLite VM instructions between deadline checks


class Watchdog:
    """One thread that calls ``interrupt`` of a query still running at its deadline.

    Started once (the worker starts it before its process limits bind), so a query never needs a
    new thread. Several queries may be armed at once (in-process use from several threads).
    """

    def __init__(self) -> None:
        self._armed: dict[int, tuple[float, Any]] = {}
        self._next = 0
        self._wake = threading.Condition()
        threading.Thread(target=self._watch, name="skyrl-sql-watchdog", daemon=True).start()

    def arm(self, deadline: float, interrupt: Any) -> int:
        with self._wake:
            self._next += 1
            self._armed[self._next] = (deadline, interrupt)
            self._wake.notify()
            return self._next

    def disarm(self, key: int) -> None:
        with self._wake:
            self._armed.pop(key, None)

    def _watch(self) -> None:
        with self._wake:
            while True:
                now = time.monotonic()
                for key, (deadline, interrupt) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        interrupt()
                soonest = min((deadline for deadline, _ in self._armed.values()), default=None)
                self._wake.wait(None if soonest is None else max(soonest - now, 0.001))


_watchdog: list[Watchdog] = []
_watchdog_lock = threading.Lock()


def watchdog() -> Watchdog:
    """The process's watchdog, started on first use."""
    with _watchdog_lock:
        if not _watchdog:
            _watchdog.append(Watchdog())
        return _watchdog[0]


def execute(conn: Any, request: QueryRequest) -> QueryResult:
    """Run ``request.sql`` on a connection made by :func:`connect`."""
    if request.engine == "sqlite":
        return _sqlite_execute(conn, request)
    return _duckdb_execute(conn, request)


def connect(engine: str, db_path: str, memory_mb: int) -> Any:
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"database file {db_path} does not exist")
    if engine == "sqlite":
        return _sqlite_connect(db_path)
    if engine == "duckdb":
        return _duckdb_connect(db_path, memory_mb)
    raise ValueError(f"unknown engine {engine!r}; use 'sqlite' or 'duckdb'")


# -- SQLite ---------------------------------------------------------------------------------------


class _GuardedSQLite(sqlite3.Connection):
    """A read-only connection whose authorizer and deadline check are installed once.

    (Setting an authorizer expires every prepared statement, so it is not swapped per query.)
    """

    guard: SQLiteGuard
    deadline: float

    def arm(self, request: QueryRequest) -> None:
        self.guard.arm(request.sql)
        self.deadline = time.monotonic() + request.timeout_s
        self.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(request.max_bytes, 1_000))  # no single giant value

    def past_deadline(self) -> int:
        return int(time.monotonic() > self.deadline)


def _sqlite_connect(db_path: str) -> _GuardedSQLite:
    # immutable=1: no locks, no journal, no -shm/-wal files created beside a WAL-mode database. Only
    # when a -wal file already holds changes must SQLite read it (plain read-only mode).
    immutable = "" if Path(f"{db_path}-wal").exists() else "&immutable=1"
    conn = sqlite3.connect(f"file:{quote(db_path)}?mode=ro{immutable}", uri=True, isolation_level=None,
                           check_same_thread=False, factory=_GuardedSQLite)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    declare_pragma_functions(conn)
    conn.guard = SQLiteGuard()
    conn.deadline = 0.0
    conn.set_authorizer(conn.guard)
    conn.set_progress_handler(conn.past_deadline, _PROGRESS_EVERY)
    return conn


def _sqlite_execute(conn: _GuardedSQLite, request: QueryRequest) -> QueryResult:
    refusal = sqlite_statement_refusal(request.sql)
    if refusal is not None:
        return QueryResult("refused", message=f"Refused: {refusal} {READ_ONLY_HINT}")
    conn.arm(request)
    try:
        cursor = conn.execute(request.sql)
        columns = [d[0] for d in cursor.description or ()]
        return _fetch(cursor, columns, request, conn.deadline)
    except sqlite3.Error as exc:
        if conn.guard.refusal is not None:
            return QueryResult("refused", message=f"Refused: {conn.guard.refusal} {READ_ONLY_HINT}")
        if conn.past_deadline() and "interrupt" in str(exc).lower():
            return _timeout(request)
        if "decode" in str(exc) and conn.text_factory is str:  # text that is not UTF-8: show it anyway
            conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
            return _sqlite_execute(conn, request)
        return QueryResult("error", message=f"{exc}")
    finally:
        if conn.in_transaction:
            conn.rollback()


# -- DuckDB ---------------------------------------------------------------------------------------


def _duckdb_connect(db_path: str, memory_mb: int) -> Any:
    import duckdb

    config = {"threads": 1, "memory_limit": f"{max(memory_mb // 2, 32)}MB", "temp_directory": "",
              "autoinstall_known_extensions": False, "autoload_known_extensions": False}
    try:  # DuckDB >= 1.3 starts 8 asynchronous I/O threads per database unless told not to
        conn = duckdb.connect(db_path, read_only=True, config={**config, "async_threads": 0})
    except duckdb.Error as exc:
        if "async_threads" not in str(exc):
            raise
        conn = duckdb.connect(db_path, read_only=True, config=config)
    # Order matters: each setting below would forbid changing the ones after it.
    for statement in ("SET enable_progress_bar = false", "SET enable_external_access = false",
                      "SET lock_configuration = true"):
        conn.execute(statement)
    return conn


def _duckdb_execute(conn: Any, request: QueryRequest) -> QueryResult:
    import duckdb

    try:
        statements = conn.extract_statements(request.sql)
    except duckdb.Error as exc:
        return QueryResult("error", message=str(exc))
    if len(statements) != 1:
        return QueryResult("error", message=f"write exactly one statement per query, got {len(statements)}.")
    refusal = duckdb_refusal(conn, statements[0].type.name, request.sql)
    if refusal is not None:
        return QueryResult("refused", message=f"Refused: {refusal} {READ_ONLY_HINT}")
    deadline = time.monotonic() + request.timeout_s
    armed = watchdog().arm(deadline, conn.interrupt)
    try:
        cursor = conn.execute(request.sql)
        columns = [d[0] for d in cursor.description or ()]
        return _fetch(cursor, columns, request, deadline)
    except duckdb.InterruptException:
        return _timeout(request)
    except duckdb.Error as exc:
        return QueryResult("error", message=str(exc))
    finally:
        watchdog().disarm(armed)


# -- shared ---------------------------------------------------------------------------------------


def _fetch(cursor: Any, columns: list[str], request: QueryRequest, deadline: float) -> QueryResult:
    rows: list[tuple[Any, ...]] = []
    size = 0
    while True:
        batch = cursor.fetchmany(min(256, request.max_rows + 1 - len(rows)))
        if not batch:
            return QueryResult("ok", columns, rows)
        for row in batch:
            size += len(repr(row))  # close to the JSON size, and one C call per row
            if size > request.max_bytes:
                return QueryResult("ok", columns, rows, cut="bytes")
            if len(rows) == request.max_rows:
                return QueryResult("ok", columns, rows, cut="rows")
            rows.append(row)
        if time.monotonic() > deadline:
            return _timeout(request)


def _timeout(request: QueryRequest) -> QueryResult:
    return QueryResult("timeout", message=f"the query ran longer than {request.timeout_s:g} s and was stopped.")


def jsonable(value: Any) -> Any:
    """``json.dumps`` fallback for database values JSON lacks (decimals stay numbers)."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "x'" + bytes(value).hex() + "'"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat(sep=" ") if isinstance(value, datetime.datetime) else value.isoformat()
    return str(value)
