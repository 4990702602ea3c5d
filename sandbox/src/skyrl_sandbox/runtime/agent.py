"""The command agent: runs one-shot commands and copies files inside a sandbox (bwrap, subprocess).

It starts trusted, applies the limits and its seccomp filter (processes allowed, kernel interfaces
closed), makes itself non-dumpable (so commands running as the same user cannot read or write its
memory or open its descriptors through /proc), then serves requests. Commands get no descriptor of
the channel, a clean environment and their own session and process group (killed when they end or
time out). Under a root parent (the subprocess backend) the agent first becomes ``nobody``. Paths of
file requests must stay inside the work directory.
"""

from __future__ import annotations

import base64
import os
import select
import signal
import subprocess
import time

from . import kernel
from .channel import connect

_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36
_NOBODY = 65534
_DRAIN_AFTER_EXIT_S = 0.2
_COMMAND_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb"}


def main(spawn_json: str) -> int:
    connected = connect(spawn_json)
    if connected is None:
        return 0
    channel, init = connected
    work_dir = os.path.realpath(init["work_dir"])
    warnings = _lock_down(init, work_dir)
    channel.send({"op": "init_done", "error": None, "warnings": warnings})
    while True:
        try:
            request = channel.receive()
        except EOFError:
            return 0
        try:
            reply = _serve(request, work_dir, init.get("env") or {})
        except Exception as exc:  # noqa: BLE001 - a bad request is answered, never fatal
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        channel.send({"op": "reply", "id": request.get("id"), **reply})


def _lock_down(init: dict, work_dir: str) -> list[str]:
    warnings = []
    if os.getuid() == 0:  # a root parent's subprocess backend: become nobody (which also drops every capability)
        os.chown(work_dir, _NOBODY, _NOBODY)
        os.setgroups([])
        os.setresgid(_NOBODY, _NOBODY, _NOBODY)
        os.setresuid(_NOBODY, _NOBODY, _NOBODY)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of commands come back here to be killed
    except (ImportError, OSError, AttributeError) as exc:
        warnings.append(f"could not make the agent non-dumpable and a subreaper: {exc}")
    return warnings + kernel.lock_down(init)


def _serve(request: dict, work_dir: str, env: dict) -> dict:
    op = request.get("op")
    if op == "ping":
        return {"error": None}
    if op == "run":
        return _run(request, work_dir, env)
    if op == "write":
        path = _inside(work_dir, request["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(request["data"]))
        os.chmod(path, int(request.get("mode", 0o644)))
        return {"error": None}
    if op == "read":
        path = _inside(work_dir, request["path"])
        with open(path, "rb") as handle:
            data = handle.read(int(request["max_bytes"]) + 1)
        limit = int(request["max_bytes"])
        return {"error": None, "data": base64.b64encode(data[:limit]).decode(), "truncated": len(data) > limit}
    return {"error": f"unknown request {str(op)[:40]!r}"}


def _inside(work_dir: str, path: str) -> str:
    full = os.path.realpath(os.path.join(work_dir, path))
    if full != work_dir and not full.startswith(work_dir + os.sep):
        raise PermissionError(f"{path!r} is outside the work directory {work_dir}")
    return full


def _run(request: dict, work_dir: str, env: dict) -> dict:
    cwd = _inside(work_dir, request.get("cwd") or ".")
    limit = int(request["max_output_bytes"])
    try:
        process = subprocess.Popen(
            [str(arg) for arg in request["argv"]], cwd=cwd, env={**_COMMAND_ENV, "HOME": work_dir, **env},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
            start_new_session=True)
    except OSError as exc:  # as a shell reports it: 127 not found, 126 not executable
        message = f"{request['argv'][0]}: {exc.strerror}\n".encode()
        return {"error": None, "exit_code": 127 if isinstance(exc, FileNotFoundError) else 126, "timed_out": False,
                "stdout": "", "stdout_truncated": False, "stderr": base64.b64encode(message).decode(),
                "stderr_truncated": False}
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    outputs = {out_fd: bytearray(), err_fd: bytearray()}
    dropped = dict.fromkeys(outputs, 0)
    pending = base64.b64decode(request.get("stdin") or "")
    writer = process.stdin
    if not pending:
        writer.close()
        writer = None
    deadline = time.monotonic() + float(request["timeout_s"])
    timed_out = False
    readers = list(outputs)
    while readers or writer is not None:
        if process.poll() is not None:  # a background child may keep the pipes open: read what is there, stop
            deadline = min(deadline, time.monotonic() + _DRAIN_AFTER_EXIT_S)
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = process.poll() is None
            break
        # short waits: the command exiting does not wake select while a background child holds the pipes
        ready_read, ready_write, _ = select.select(readers, [writer] if writer is not None else [], [], min(left, 0.05))
        for fd in ready_read:
            chunk = os.read(fd, 65536)
            if not chunk:
                readers.remove(fd)
                continue
            room = max(limit - len(outputs[fd]), 0)
            outputs[fd] += chunk[:room]
            dropped[fd] += len(chunk) - min(room, len(chunk))
        if ready_write:
            try:
                written = os.write(writer.fileno(), pending[:65536])
                pending = pending[written:]
            except BrokenPipeError:
                pending = b""
            if not pending:
                writer.close()
                writer = None
    if not timed_out:  # its output is closed: let it finish exiting before what it left is killed
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            timed_out = True
    _kill_group(process.pid)
    status = process.wait()
    _kill_and_reap_descendants()
    for stream in (process.stdout, process.stderr, writer):
        if stream is not None:
            stream.close()
    return {"error": None, "exit_code": status, "timed_out": timed_out,
            "stdout": base64.b64encode(bytes(outputs[out_fd])).decode(), "stdout_truncated": dropped[out_fd] > 0,
            "stderr": base64.b64encode(bytes(outputs[err_fd])).decode(), "stderr_truncated": dropped[err_fd] > 0}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_and_reap_descendants() -> None:
    """Nothing a command started outlives it: kill and reap every child left (daemons included)."""
    for _ in range(100):
        children = _children()
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(block_s=0.01)
    _reap(block_s=0.0)


def _children() -> list[int]:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                pids += [int(pid) for pid in children.read().split()]
        except OSError:
            continue
    return pids


def _reap(block_s: float) -> None:
    deadline = time.monotonic() + block_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.001)
