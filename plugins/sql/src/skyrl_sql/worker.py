"""The sandbox process: reads query requests as JSON lines on stdin, answers on stdout.

Started by :mod:`skyrl_sql.sandbox` as ``python -m skyrl_sql.worker --memory-mb N``. It limits
its own address space, forbids itself to write files, and keeps a few read-only connections open.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import threading
from collections import OrderedDict
from typing import Any

from skyrl_sql.executors import connect, execute, jsonable
from skyrl_sql.result import QueryRequest, QueryResult

_OPEN_CONNECTIONS = 8


def limit_self(memory_mb: int) -> None:
    limit = memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file may grow: reads only
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write then fails with EFBIG instead of killing us
    threading.stack_size(1 << 20)  # timer threads must fit under the address-space limit


def serve(stdin: Any, stdout: Any, memory_mb: int) -> None:
    connections: OrderedDict[tuple[str, str], Any] = OrderedDict()
    stdout.write(json.dumps({"ready": True}) + "\n")
    stdout.flush()
    for line in stdin:
        stdout.write(json.dumps(handle(json.loads(line), connections, memory_mb), default=jsonable) + "\n")
        stdout.flush()


def handle(message: dict[str, Any], connections: OrderedDict[tuple[str, str], Any], memory_mb: int) -> dict[str, Any]:
    request = QueryRequest(**message)
    key = (request.engine, request.db_path)
    try:
        conn = connections.pop(key, None) or connect(request.engine, request.db_path, memory_mb)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memory-mb", type=int, required=True)
    args = parser.parse_args()
    limit_self(args.memory_mb)
    # Replies go to a private copy of stdout; anything a library prints lands on stderr instead.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, replies, args.memory_mb)


if __name__ == "__main__":
    main()
