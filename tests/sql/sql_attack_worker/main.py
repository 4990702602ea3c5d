"""The real SQL worker (same mounts, limits, capability drop and seccomp filter) with its query guard
switched off and SQLite functions that do what code running inside the worker after an engine exploit
could: read and list files, connect, fork, exec, signal, and write raw frames to the parent.

Each function returns what happened as text ("ok: ..." or "ExceptionName: ..."), so the test sees
the outcome in the query's result.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import socket
import subprocess
import threading
import time

from skyrl_sql_worker import executors
from skyrl_sql_worker import main as worker


class AllowEverything:
    """A SQLite authorizer that allows every operation (the guard, bypassed)."""

    refusal = None

    def arm(self, sql: str) -> None:
        pass

    def __call__(self, *args: object) -> int:
        return 0


def _outcome(action):
    def run(*args):
        try:
            return f"ok: {action(*args)}"
        except BaseException as exc:  # noqa: BLE001 - the outcome is the result
            return f"{type(exc).__name__}: {exc}"
    return run


def _read(path):
    with open(path, "rb") as handle:
        return handle.read(4000).decode("utf-8", "replace")


def _connect(host, port):
    socket.create_connection((host, int(port)), timeout=2).close()
    return "connected"


def _fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "forked"


def _channel_fd():
    channel = next(item for item in gc.get_objects() if type(item).__name__ == "Channel")
    return channel._write_fd


def _frame(kind, request_id):
    """Write a frame of ``kind`` to the parent, now or (``later``) from a thread after the query ended."""
    request_id = int(request_id)
    result = {"op": "result", "id": request_id, "status": "ok", "columns": ["forged"], "rows": [["FORGED"]],
              "cut": None, "message": ""}
    payloads = {
        "oversized": (0xFFFFFFF0).to_bytes(4, "big") + b"{",
        "other_id": None, "current": None, "later": None,
        "not_json": b"\x00\x00\x00\x08not json",
        "not_an_object": b"\x00\x00\x00\x02[]",
        "nested": None,
    }
    if kind == "other_id":
        payloads[kind] = _encode({**result, "id": request_id + 7})
    elif kind in ("current", "later"):
        payloads[kind] = _encode(result)
    elif kind == "nested":  # 100 levels deep, and big enough (over 64 KiB) to have its structure checked
        payload = (f'{{"op": "result", "id": {request_id}, "pad": "{"x" * 70_000}", "rows": '.encode()
                   + b"[" * 100 + b"]" * 100 + b"}")
        payloads[kind] = len(payload).to_bytes(4, "big") + payload
    data, fd = payloads[kind], _channel_fd()
    if kind == "later":
        threading.Thread(target=lambda: (time.sleep(0.3), os.write(fd, data))).start()
    else:
        os.write(fd, data)
    return kind


def _encode(message):
    payload = json.dumps(message).encode()
    return len(payload).to_bytes(4, "big") + payload


FUNCTIONS = {
    "host_read": _outcome(_read),
    "host_list": _outcome(lambda path: ",".join(sorted(os.listdir(path)))),
    "host_connect": _outcome(_connect),
    "host_fork": _outcome(_fork),
    "host_exec": _outcome(lambda: subprocess.run(["/bin/true"], check=False).returncode),
    "host_signal": _outcome(lambda pid: os.kill(int(pid), 0)),
    "host_frame": _outcome(_frame),
    "host_import": _outcome(lambda name: importlib.import_module(name).__file__),
}


def main(spawn_json: str) -> int:
    real_connect = executors._sqlite_connect

    def connect(db_path):
        conn = real_connect(db_path)
        for name, function in FUNCTIONS.items():
            conn.create_function(name, -1, function)
        return conn

    executors._sqlite_connect = connect
    executors.SQLiteGuard = AllowEverything
    executors.duckdb_refusal = lambda *args: None
    return worker.main(spawn_json)
