"""One call run in a short-lived forked child with resource limits: how the bridge scores answers that a
reasoning-gym scorer evaluates as Python (``eval``, ``sympy.parse_expr``).

:func:`call_in_child` forks (under the process-wide peer lock of :mod:`skyrl_core.peer_rng`, so no other peer
call is halfway through when the process is copied), and the child sets its limits before it runs anything:
``RLIMIT_AS`` (its address space may grow by :data:`MEMORY_HEADROOM_BYTES` over the parent's, which it shares
copy-on-write: an absolute cap would starve a trainer that maps gigabytes), ``RLIMIT_CPU`` (the timeout plus a
second) and no core files. The parent waits on a pipe for at most ``timeout_s`` seconds of wall clock, then kills
the child (``SIGKILL``) and reaps it. A child that runs past its time, dies (a signal, ``SIGXCPU``) or runs out of
memory raises :class:`ChildFailed`; what the call itself raised comes back as :class:`ChildRaised`. Where the
platform cannot fork, the call runs in the process (:data:`FORKS` is ``False``) and only the guard protects it.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from skyrl_core.peer_rng import global_rng_kept

try:
    import resource
except ImportError:  # pragma: no cover - not on Windows
    resource = None  # type: ignore[assignment]

FORKS = hasattr(os, "fork")
MEMORY_HEADROOM_BYTES = 1 << 30
"""How much the child's address space may grow over the parent's (1 GiB)."""
_MAX_REPLY = 1 << 16


class ChildFailed(RuntimeError):
    """The child ran past its time, died, or exceeded its memory or CPU limit."""


class ChildRaised(RuntimeError):
    """The call raised in the child; the message is ``Type: message``."""


def call_in_child(fn: Callable[..., Any], *args: Any, timeout_s: float) -> float:
    """``float(fn(*args))`` computed in a forked child with resource limits, within ``timeout_s`` seconds."""
    if not FORKS:  # pragma: no cover - Windows
        return float(fn(*args))
    with global_rng_kept():  # made and closed under the lock: no other child inherits this pipe's write end
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(read_fd, write_fd, fn, args, timeout_s)
        os.close(write_fd)
    try:
        reply = _read(read_fd, time.monotonic() + timeout_s)
    finally:
        os.close(read_fd)
        status = _reap(pid)
    if reply is None:
        raise ChildFailed(f"the scorer ran past its {timeout_s:g} s time limit and was stopped")
    if not reply:
        raise ChildFailed(f"the scorer's process died ({_why(status)})")
    kind, value = _parsed(reply)
    if kind == "ok":
        return float(value)
    if kind == "memory":
        raise ChildFailed("the scorer exceeded its memory limit")
    raise ChildRaised(str(value))


def _parsed(reply: bytes) -> tuple[str, Any]:
    """The child's reply, read as data (JSON, never pickle: the child ran the peer on model text)."""
    try:
        kind, value = json.loads(reply)
    except (ValueError, TypeError):
        raise ChildFailed("the scorer's process sent back something unreadable") from None
    if kind == "ok" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return kind, value
    if kind in ("memory", "raised") and isinstance(value, str):
        return kind, value
    raise ChildFailed("the scorer's process sent back something unreadable")


def _child(read_fd: int, write_fd: int, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> None:
    code = 0
    try:
        os.close(read_fd)
        gc.freeze()  # the parent's objects are never collected here: their pages stay shared
        _limit(timeout_s)
        try:
            reply: tuple[str, Any] = ("ok", float(fn(*args)))
        except MemoryError:
            reply = ("memory", "")
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as text
            reply = ("raised", f"{type(exc).__name__}: {exc}"[:300])
        data = json.dumps(reply).encode()
        while data:
            data = data[os.write(write_fd, data):]
    except BaseException:  # noqa: BLE001 - the parent sees an empty reply: the child died
        code = 1
    finally:
        os._exit(code)


def _limit(timeout_s: float) -> None:
    if resource is None:  # pragma: no cover
        return
    cpu = int(timeout_s) + 2
    _set(resource.RLIMIT_CPU, cpu, cpu + 1)
    _set(resource.RLIMIT_CORE, 0, 0)
    try:
        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # no /proc (macOS, where RLIMIT_AS is barely enforced anyway)
        return
    _set(resource.RLIMIT_AS, size + MEMORY_HEADROOM_BYTES, None)


def _set(which: int, soft: int, hard: int | None) -> None:
    _, current_hard = resource.getrlimit(which)
    if current_hard != resource.RLIM_INFINITY:
        soft = min(soft, current_hard)
        hard = current_hard if hard is None else min(hard, current_hard)
    elif hard is None:
        hard = current_hard
    try:
        resource.setrlimit(which, (soft, hard))
    except (ValueError, OSError):  # pragma: no cover - a platform that refuses it: the wall clock still holds
        pass


def _read(fd: int, deadline: float) -> bytes | None:
    """The child's whole reply (``b""``: it died without one), or ``None`` at the deadline."""
    chunks: list[bytes] = []
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                return None
            chunk = os.read(fd, _MAX_REPLY)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            if sum(map(len, chunks)) > _MAX_REPLY:
                return b""


def _reap(pid: int) -> int:
    """Wait for the child (killing it first unless it has already exited); its wait status."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover - it exited in between
            pass
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:  # pragma: no cover - reaped elsewhere (SIGCHLD ignored): nothing to wait for
        return 0


def _why(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:  # pragma: no cover
            name = str(sig)
        return f"signal {name}" + (": its CPU time limit" if name == "SIGXCPU" else "")
    return f"exit status {os.WEXITSTATUS(status)}"
