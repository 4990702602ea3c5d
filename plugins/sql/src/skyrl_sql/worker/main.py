"""The query worker's entry point: lock down while still trusted, then answer query requests until EOF.

Started by :mod:`skyrl_sql.sandbox` through skyrl-sandbox as ``skyrl_sql_worker.main``. Before the
first query it starts the one thread a query may need (the DuckDB watchdog), applies the rlimits
it was sent, forbids itself to grow any file, drops every capability and installs the seccomp
filter (no new processes or programs, signals only to itself); nothing a query does can undo them.
It keeps a few read-only connections open between queries.
"""

from __future__ import annotations

import json
import resource
import signal
import threading
from collections import OrderedDict
from typing import Any

from skyrl_sandbox_runtime import kernel
from skyrl_sandbox_runtime.channel import Channel, connect

from .executors import connect as open_database
from .executors import execute, jsonable, watchdog
from .result import QueryRequest, QueryResult

_OPEN_CONNECTIONS = 8
_MAX_ERROR_CHARS = 4000


def main(spawn_json: str) -> int:
    connected = connect(spawn_json)
    if connected is None:
        return 0
    channel, init = connected
    try:
        warnings = lock_down(init)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which says why the sandbox cannot start
        channel.send({"op": "init_done", "error": f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]})
        return 1
    channel.send({"op": "init_done", "error": None, "warnings": warnings})
    return serve(channel, init["memory_mb"])


def lock_down(init: dict[str, Any]) -> list[str]:
    """Everything set up while no query has run yet; returns the protections that could not be had."""
    if init.get("engine") == "duckdb":
        import duckdb  # noqa: F401 - loaded now: an import failure is a start failure, not a query's
    threading.stack_size(1 << 20)  # threads must fit under the address-space limit
    watchdog()  # the only thread queries use, started before max_processes binds
    problems = kernel.lock_down(init)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file may grow: reads only
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write then fails with EFBIG instead of killing us
    return problems


def serve(channel: Channel, memory_mb: int) -> int:
    connections: OrderedDict[tuple[str, str], Any] = OrderedDict()
    while True:
        try:
            message = channel.receive()
        except EOFError:
            return 0
        if message.get("op") != "query":
            continue  # the parent sends nothing else
        reply = handle(message["request"], connections, memory_mb)
        send_reply(channel, {"op": "result", "id": message["id"], **reply})


def handle(message: dict[str, Any], connections: OrderedDict[tuple[str, str], Any], memory_mb: int) -> dict[str, Any]:
    request = QueryRequest(**message)
    key = (request.engine, request.db_path)
    try:
        conn = connections.pop(key, None) or open_database(request.engine, request.db_path, memory_mb)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as an infrastructure failure
        return {"infra_error": f"cannot open {request.engine} database {request.db_path}: {type(exc).__name__}: {exc}"}
    connections[key] = conn
    while len(connections) > _OPEN_CONNECTIONS:
        connections.popitem(last=False)[1].close()
    try:
        return execute(conn, request).to_json()
    except MemoryError:
        connections.pop(key).close()
        return QueryResult("crashed", message="the query needed more memory than the limit and was stopped.").to_json()
    except Exception as exc:  # noqa: BLE001 - the worker must outlive any one query
        return QueryResult("error", message=f"{type(exc).__name__}: {exc}").to_json()


def send_reply(channel: Channel, reply: dict[str, Any]) -> None:
    """Send a result; values JSON lacks are converted, and a result over the channel's cap loses rows."""
    try:
        channel.send(reply)
        return
    except TypeError:  # decimals, dates, blobs...: only then pay for a conversion
        reply = json.loads(json.dumps(reply, default=jsonable))
    except ValueError:
        pass
    while True:
        try:
            channel.send(reply)
            return
        except ValueError:  # over the channel's size cap: keep the rows that fit
            rows = reply.get("rows") or []
            if not rows:
                channel.send({"op": "result", "id": reply["id"], "status": "error", "columns": [], "rows": [],
                              "cut": None, "message": "the result is too large to return."})
                return
            reply = {**reply, "rows": rows[: len(rows) // 2], "cut": "bytes"}
