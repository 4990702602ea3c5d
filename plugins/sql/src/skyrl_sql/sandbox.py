"""Parent side of the query sandbox: a small pool of worker processes shared by all envs.

Each query goes to an idle worker over a pipe. A worker that does not answer within the query's
time limit plus a grace period, or that dies (memory limit, crash), is killed and replaced; the
caller gets a ``timeout``/``crashed`` result, never a hung or dead trainer.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from skyrl_sql.result import QueryRequest, QueryResult

log = logging.getLogger(__name__)

# Workers are started from this one long-lived thread: bubblewrap's --die-with-parent kills the
# sandbox when the *thread* that started it exits, and env steps run on short-lived worker threads.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skyrl-sql-spawner")

GRACE_S = 2.0  # the worker stops its own queries; this is the backstop when it cannot
START_TIMEOUT_S = 30.0


class SandboxError(RuntimeError):
    """The sandbox itself failed (cannot start, cannot open the database): not the model's fault."""


@dataclass(frozen=True)
class SandboxSettings:
    kind: Literal["auto", "process", "bwrap"] = "auto"
    memory_mb: int = 2048
    workers: int = 4

    def command(self) -> list[str]:
        python = [sys.executable, "-m", "skyrl_sql.worker", "--memory-mb", str(self.memory_mb)]
        if self.kind == "process" or (self.kind == "auto" and bwrap_path() is None):
            return python
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxError("env.sandbox=bwrap needs a working bubblewrap (apt-get install bubblewrap; "
                               "in containers it also needs user namespaces); or set env.sandbox=process")
        return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--unshare-all", "--die-with-parent", "--new-session", *python]


@functools.cache
def bwrap_path() -> str | None:
    """bubblewrap's path if it is installed and can create a sandbox here, else ``None``."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True)
    if probe.returncode != 0:
        log.warning("bubblewrap cannot create a sandbox here (%s); SQL queries run in plain limited processes",
                    probe.stderr.decode(errors="replace").strip())
        return None
    return bwrap


class Worker:
    """One sandbox process and its pipes."""

    def __init__(self, settings: SandboxSettings) -> None:
        # No secrets from the trainer's environment: only what Python needs to start.
        env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = _SPAWNER.submit(subprocess.Popen, settings.command(), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, close_fds=True).result()
        self._buffer = b""
        try:
            ready = self._read_line(time.monotonic() + START_TIMEOUT_S)
        except EOFError:
            ready = None
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            raise SandboxError(f"SQL sandbox process failed to start (exit code {self.process.poll()}); "
                               f"command: {' '.join(settings.command())}")

    def call(self, request: QueryRequest) -> QueryResult:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(request.to_json()) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            return self._crashed()
        try:
            line = self._read_line(time.monotonic() + request.timeout_s + GRACE_S)
        except EOFError:
            return self._crashed()
        if line is None:
            self.kill()
            return QueryResult("timeout", message=f"the query ran longer than {request.timeout_s:g} s and was stopped.")
        reply = json.loads(line)
        if "infra_error" in reply:
            raise SandboxError(reply["infra_error"])
        return QueryResult.from_json(reply)

    def _crashed(self) -> QueryResult:
        self.kill()
        return QueryResult("crashed", message="the query crashed the database process (out of memory?) "
                                              "and was stopped.")

    def _read_line(self, deadline: float) -> bytes | None:
        """One reply line, or ``None`` if the deadline passes; ``EOFError`` if the process closed its output."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError("the sandbox process closed its output")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class QueryRunner:
    """Runs queries on a pool of at most ``settings.workers`` sandbox processes, started lazily."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        # LIFO: a warm worker is reused before an empty slot starts another process.
        self._slots: queue.LifoQueue[Worker | None] = queue.LifoQueue()
        for _ in range(settings.workers):
            self._slots.put(None)
        self._all: list[Worker] = []
        self._lock = threading.Lock()

    def run(self, request: QueryRequest) -> QueryResult:
        worker = self._slots.get()
        try:
            if worker is None or not worker.alive:
                worker = Worker(self.settings)
                with self._lock:
                    self._all = [w for w in self._all if w.alive] + [worker]
            result = worker.call(request)
            if not worker.alive:
                worker = None
            return result
        finally:
            self._slots.put(worker)

    def close(self) -> None:
        with self._lock:
            for worker in self._all:
                worker.kill()
            self._all.clear()


_RUNNERS: dict[SandboxSettings, QueryRunner] = {}
_RUNNERS_LOCK = threading.Lock()


def get_runner(settings: SandboxSettings) -> QueryRunner:
    """The process-wide runner for these settings (envs are cheap; sandbox processes are shared)."""
    with _RUNNERS_LOCK:
        runner = _RUNNERS.get(settings)
        if runner is None:
            runner = _RUNNERS[settings] = QueryRunner(settings)
        return runner


@atexit.register
def _close_all() -> None:
    for runner in _RUNNERS.values():
        runner.close()
