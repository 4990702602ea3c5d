"""Parent side of the query sandbox: skyrl-sandbox workers, shared by all envs of a process.

Each query goes to an idle worker (the :mod:`skyrl_sql.worker` program) over a capped, framed
channel. A worker that does not answer within the query's time limit plus a grace period, that
dies (memory limit, crash) or that breaks the protocol (a forged, stray or oversized frame) is
killed and replaced; the caller gets a ``timeout``/``crashed`` result, never a hung or dead trainer.

Workers see only what they need, read-only: the Python standard library, their own stdlib-only
package, the DuckDB distribution (for the DuckDB engine) and the database folders of the envs that
use them. A folder is added when a query first needs it; workers started before then are retired.

The thread that runs a query drives its worker itself: frames are written and read with deadlines
(``poll``) rather than through an event loop, so a query costs one round trip between two
processes (tens of microseconds), not a thread hop on top.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from skyrl_sandbox import (
    BackendUnavailable,
    Limits,
    ProtocolViolation,
    SandboxError,
    WorkerGone,
    WorkerPool,
    WorkerProgram,
    backend_names,
    resolve_backend,
)
from skyrl_sandbox import framing as protocol
from skyrl_sandbox.channel import BlockingChannel
from skyrl_sandbox.startup import WorkerSetup, start_worker_blocking
from skyrl_sandbox.worker import Worker

from skyrl_sql.config import GRACE_S  # the worker stops its own queries; the grace is the backstop
from skyrl_sql.worker.result import QueryRequest, QueryResult

log = logging.getLogger(__name__)

WORKER_PACKAGE = Path(__file__).resolve().parent / "worker"
WORKER_NAME = "skyrl_sql_worker"  # the package's name inside the sandbox
START_TIMEOUT_S = 30.0
SPARE_WORKERS = 1  # kept started, so a killed worker is replaced without waiting for an interpreter
MAX_THREADS = 16  # main thread and watchdog; DuckDB runs with threads=1 and no asynchronous I/O threads
TMP_SIZE_MB = 1  # the worker writes no file; /tmp only has to exist
_STATUSES = ("ok", "error", "refused", "timeout", "crashed")
_REAL_PATHS_CACHED = 4096
_MAX_MESSAGE_CHARS = 10_000
_DELIVERY_ATTEMPTS = 3

__all__ = ["GRACE_S", "QueryRunner", "SandboxError", "SandboxSettings", "get_runner", "message_cap_mb"]


def message_cap_mb(max_result_bytes: int) -> int:
    """The channel cap that carries a result of ``max_result_bytes`` (as the worker counts them) as JSON.

    The worker measures rows by their ``repr``; JSON's ASCII escapes can make text up to 6 times
    longer (a result that still does not fit loses rows and says so).
    """
    return math.ceil(6 * max_result_bytes / 2**20) + 1


@dataclass(frozen=True)
class SandboxSettings:
    """How the workers of one runner are started (``backend``: auto or an installed sandbox backend's name)."""

    backend: str = "auto"
    engine: str = "sqlite"
    memory_mb: int = 2048
    workers: int = 4
    cpu_time_s: int = 3600
    max_message_mb: int = message_cap_mb(16_000_000)

    def limits(self) -> Limits:
        return Limits(cpu_time_s=self.cpu_time_s, memory_mb=self.memory_mb, max_processes=MAX_THREADS,
                      max_open_files=256, max_file_size_mb=1, tmp_size_mb=TMP_SIZE_MB,
                      max_message_mb=self.max_message_mb)


def worker_program(engine: str, roots: tuple[str, ...]) -> WorkerProgram:
    """The worker with its read-only view: the database folders and, for DuckDB, the duckdb distribution."""
    read_only, python_path = roots, ()
    if engine == "duckdb":
        site, entries = distribution_paths("duckdb")
        read_only, python_path = (*roots, *entries), (site,)
    return WorkerProgram(module=f"{WORKER_NAME}.main", packages={WORKER_NAME: WORKER_PACKAGE},
                         read_only=read_only, python_path=python_path)


@functools.cache
def distribution_paths(name: str) -> tuple[str, tuple[str, ...]]:
    """The folder an installed distribution lives in, and its own top-level entries there (code and metadata).

    Mounting only those shows the sandbox one distribution, not the whole site-packages beside it.
    """
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise SandboxError(f"the {name} package is not installed: pip install {name}") from None
    site = Path(dist.locate_file("")).resolve()
    tops = {PurePath(file).parts[0] for file in dist.files or () if PurePath(file).parts[:1] != ("..",)}
    return str(site), tuple(sorted(str(site / top) for top in tops if (site / top).exists()))


class _Worker:
    """One started worker, driven synchronously over its :class:`~skyrl_sandbox.channel.BlockingChannel`
    by one thread at a time: a query is a blocking call of an env step, and a thread hop per query
    would cost more than the query."""

    def __init__(self, process: Worker, channel: BlockingChannel, generation: int) -> None:
        self.process = process
        self.channel = channel
        self.generation = generation
        self.busy_s = 0.0
        self.last_id = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """Kill, reap and remove the worker's files."""
        self.process.discard()

    def stop_after_death(self) -> str:
        """Reap a worker whose channel closed (giving it a moment to finish dying) and say why it ended."""
        reason = self.process.describe_exit(self.process.reap(grace_s=1.0))  # before discard() removes the cgroup
        self.process.discard()
        return reason


class QueryRunner:
    """Runs queries on at most ``settings.workers`` sandbox workers, started on demand and kept between queries.

    Thread-safe: each :meth:`run` takes an idle worker (or starts one) and drives it from the
    calling thread.
    """

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        try:
            self.backend = resolve_backend(settings.backend)
        except BackendUnavailable as exc:
            raise BackendUnavailable(exc.backend, f"{exc} In the sql env the setting is env.sandbox (auto, "
                                                  f"{', '.join(backend_names())}).") from None
        self._limits = settings.limits()
        self._setup = WorkerSetup("SQL", self._limits, prepare=lambda worker: {"engine": settings.engine,
                                                                               "memory_mb": settings.memory_mb},
                                  timeout_s=START_TIMEOUT_S)
        self._lock = threading.Lock()
        self._roots: tuple[str, ...] = ()
        self._covered: dict[str, bool] = {}  # folder -> inside a mounted root (a cache)
        self._real_paths: dict[str, str] = {}  # database path -> its real path (a cache)
        self._pool: WorkerPool | None = None
        self._generation = 0
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots = threading.BoundedSemaphore(settings.workers)
        self._closed = False

    @property
    def roots(self) -> tuple[str, ...]:
        """The database folders the workers see (read-only, at their host paths)."""
        return self._roots

    def add_root(self, folder: str | os.PathLike[str]) -> None:
        """Let workers read databases under ``folder``; workers started without it are retired."""
        key = os.fspath(folder)
        if self._covered.get(key):
            return
        real = os.path.realpath(key)
        with self._lock:
            if not _inside(real, self._roots):
                self._roots = tuple(sorted({*(root for root in self._roots if not _inside(root, (real,))), real}))
                old, self._pool = self._pool, WorkerPool(worker_program(self.settings.engine, self._roots),
                                                         self._limits, self.backend, SPARE_WORKERS)
                self._generation += 1
                if old is not None:
                    old.close()
            self._covered[key] = True

    def worker_pids(self) -> list[int]:
        """Host pids of the started workers (with bwrap: the bwrap process holding each)."""
        with self._lock:
            return [worker.pid for worker in [*self._idle, *self._busy]]

    def run(self, request: QueryRequest) -> QueryResult:
        """Run one query in a worker; problems caused by the query come back in the result.

        Raises :class:`SandboxError` when the sandbox itself fails (cannot start, cannot open the
        database).
        """
        if self._closed:
            raise SandboxError("run() on a closed query runner")
        if request.engine != self.settings.engine:
            raise SandboxError(f"a {request.engine} query sent to the runner of {self.settings.engine} workers")
        db_path = self._real_paths.get(request.db_path)
        if db_path is None:
            db_path = os.path.realpath(request.db_path)
            if not os.path.isfile(db_path):
                raise SandboxError(f"cannot open {request.engine} database {request.db_path}: the file does not "
                                   "exist")
            if len(self._real_paths) >= _REAL_PATHS_CACHED:
                self._real_paths.clear()
            self._real_paths[request.db_path] = db_path
        folder = os.path.dirname(db_path)
        if not self._covered.get(folder):
            self.add_root(folder)
        with self._slots:
            result = self._deliver(request, db_path)
        if isinstance(result, SandboxError):
            raise result
        return result

    def _deliver(self, request: QueryRequest, db_path: str) -> QueryResult | SandboxError:
        """The query's outcome on a worker; a worker found dead when the query is sent is not its doing."""
        for _ in range(_DELIVERY_ATTEMPTS):
            try:
                worker = self._take(request.timeout_s + GRACE_S, time.monotonic() + request.timeout_s + GRACE_S)
            except TimeoutError:
                return _timed_out(request)
            keep = False
            try:
                result, keep = self._query(worker, request, db_path)
            finally:
                self._release(worker, keep)
            if result is not None:
                return result
        raise SandboxError(f"{_DELIVERY_ATTEMPTS} SQL sandbox workers ({self.backend}) in a row died before they "
                           "could read a query")

    def close(self) -> None:
        """Kill the idle workers and stop starting new ones; busy workers are killed when their query ends."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            idle, self._idle = self._idle, []
        if pool is not None:
            pool.close()
        for worker in idle:
            worker.stop()

    def _release(self, worker: _Worker, keep: bool) -> None:
        """Put a worker back among the idle ones, or stop it."""
        with self._lock:
            self._busy.discard(worker)
            if keep and not self._closed:
                self._idle.append(worker)
                return
        worker.stop()

    def _take(self, needed_s: float, deadline: float) -> _Worker:
        """A started worker of the current program with CPU time left for ``needed_s``, else a new one
        (TimeoutError: a spare that did not answer by the query's ``deadline``)."""
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None  # LIFO: warm workers first
                if worker is not None:
                    self._busy.add(worker)
            if worker is None:
                break
            if worker.generation != self._generation or not worker.process.running():
                pass
            elif worker.busy_s + needed_s > self._limits.cpu_time_s / 2:
                pass  # replaced long before RLIMIT_CPU could stop one of its queries
            elif worker.channel.has_unread_data():
                log.warning("an idle SQL sandbox worker (%s) sent unrequested data and was replaced", self.backend)
            else:
                return worker
            with self._lock:
                self._busy.discard(worker)
            worker.stop()
        worker = self._start(deadline)
        with self._lock:
            self._busy.add(worker)
        return worker

    def _start(self, deadline: float) -> _Worker:
        """A worker started and locked down; a pre-started spare gets only until the query's ``deadline``
        to answer (TimeoutError: a frozen one must not hold the query longer)."""
        with self._lock:
            pool, generation = self._pool, self._generation
        if pool is None:
            raise SandboxError("the query runner is closed")
        try:
            process, channel = start_worker_blocking(pool, self._setup, spare_deadline=deadline)
        except TimeoutError:
            log.warning("a spare SQL sandbox worker (%s) did not answer within a query's time limit and was replaced",
                        self.backend)
            raise
        return _Worker(process, channel, generation)

    def _query(self, worker: _Worker, request: QueryRequest,
               db_path: str) -> tuple[QueryResult | SandboxError | None, bool]:
        """The query's result (or the infrastructure error the worker reported), and whether the worker
        may serve another query; None when the worker was gone before it could read the query.

        A worker killed between queries can still look alive: a dying process's threads exit one by
        one and it is reaped only after the last, while its channel may already be closed.
        """
        worker.last_id += 1
        started = time.monotonic()
        deadline = started + request.timeout_s + GRACE_S
        try:
            try:
                worker.channel.send({"op": "query", "id": worker.last_id,
                                     "request": {**request.to_json(), "db_path": db_path}}, deadline)
            except WorkerGone:
                return None, False
            return _read_result(worker.channel.receive(deadline, _result_structure(request)), worker.last_id, request), True
        except TimeoutError:
            return _timed_out(request), False
        except WorkerGone:
            reason = worker.stop_after_death()
            if "memory limit" in reason:
                return QueryResult("crashed", message="the query needed more memory than the limit and was "
                                                      "stopped."), False
            return QueryResult("crashed", message=f"the query crashed the database process (it {reason}) and was "
                                                  "stopped."), False
        except ProtocolViolation as exc:
            log.warning("an SQL sandbox worker (%s) broke the protocol and was replaced: %s", self.backend, exc)
            return QueryResult("crashed", message="the database process sent an invalid reply and was stopped."), False
        finally:
            worker.busy_s += time.monotonic() - started


def _timed_out(request: QueryRequest) -> QueryResult:
    return QueryResult("timeout", message=f"the query ran longer than {request.timeout_s:g} s and was stopped.")


def _result_structure(request: QueryRequest) -> tuple[int, int]:
    """Structure limits that fit every result the worker may send for ``request``.

    A result holds a list per row, at most ``max_rows``, and at most one item (a comma) per 3 bytes of
    the rows' ``repr``, which the worker keeps under ``max_bytes`` (``(1, 2)``: 6 bytes, 2 items with the
    comma after the row); the generic limits stay as the allowance for the rest (columns, nested values).
    """
    return protocol.MAX_CONTAINERS + request.max_rows, protocol.MAX_ITEMS + request.max_bytes // 3


def _read_result(message: dict[str, Any], request_id: int, request: QueryRequest) -> QueryResult | SandboxError:
    """The result in a worker's reply (or the infrastructure error it reports), checked like any hostile input."""
    protocol.expect(message, "result")
    if protocol.int_field(message, "id") != request_id:
        raise ProtocolViolation("a result for another query")
    infra_error = protocol.text_field(message, "infra_error", _MAX_MESSAGE_CHARS)
    if infra_error is not None:
        return SandboxError(infra_error)
    status, columns, rows, cut = message.get("status"), message.get("columns"), message.get("rows"), message.get("cut")
    if status not in _STATUSES:
        raise ProtocolViolation(f"unknown result status {str(status)[:40]!r}")
    if not isinstance(columns, list) or not all(isinstance(column, str) for column in columns):
        raise ProtocolViolation("field 'columns' must be a list of strings")
    if not isinstance(rows, list) or len(rows) > request.max_rows or not all(isinstance(row, list) for row in rows):
        raise ProtocolViolation(f"field 'rows' must be a list of at most {request.max_rows:,} rows")
    if cut not in (None, "rows", "bytes"):
        raise ProtocolViolation("field 'cut' must be null, 'rows' or 'bytes'")
    return QueryResult(status=status, columns=columns, rows=[tuple(row) for row in rows], cut=cut,
                       message=protocol.text_field(message, "message", _MAX_MESSAGE_CHARS, optional=False))


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


_RUNNERS: dict[tuple[int, SandboxSettings], QueryRunner] = {}
_RUNNERS_LOCK = threading.Lock()


def get_runner(settings: SandboxSettings) -> QueryRunner:
    """The process-wide runner for these settings (envs are cheap; sandbox workers are shared)."""
    key = (os.getpid(), settings)
    runner = _RUNNERS.get(key)
    if runner is None:
        with _RUNNERS_LOCK:
            runner = _RUNNERS.get(key)
            if runner is None:
                runner = _RUNNERS[key] = QueryRunner(settings)
    return runner
