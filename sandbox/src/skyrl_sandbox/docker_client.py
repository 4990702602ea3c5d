"""The Docker Engine client: which engine to talk to, a connected ``docker`` SDK client (one per process),
and whether an engine answers at all. The ``docker`` SDK (optional extra) is imported on use only.

The container worker (:mod:`.docker_engine`), the image builds (:mod:`.images`), the machines and the
backend probe (:mod:`.backends`) all reach the engine through here.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

# Where scripts/setup.sh starts an engine of its own when none answers (data, socket and log live there).
SKYRL_DOCKER_SOCKET = Path("/var/lib/skyrl-docker/docker.sock")
_clients: dict[int, Any] = {}
_clients_lock = threading.Lock()


def docker_host() -> str | None:
    """The engine to talk to: DOCKER_HOST, else the default socket, else the one setup.sh starts.

    Of the two sockets, one that accepts connections wins over one left behind by a stopped engine.
    """
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    present = [path for path in (Path("/var/run/docker.sock"), SKYRL_DOCKER_SOCKET) if path.exists()]
    for path in present:
        if _accepts(path):
            return f"unix://{path}"
    return f"unix://{present[0]}" if present else None


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def client() -> Any:
    """A connected ``docker.DockerClient``; raises ImportError or the SDK's error when that fails."""
    import docker

    host = docker_host()
    return docker.DockerClient(base_url=host) if host else docker.from_env()


def shared_client() -> Any:
    """This process's client (a forked child makes its own: connections must not be shared)."""
    pid = os.getpid()
    with _clients_lock:
        if pid not in _clients:
            _clients[pid] = client()
        return _clients[pid]


def engine_problem() -> str | None:
    """None when a Docker Engine answers; else why not."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK is not installed (pip install 'skyrl-sandbox[docker]')"
    try:
        client().ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is the answer
        return f"no Docker Engine answers ({docker_host() or 'DOCKER_HOST unset'}): {type(exc).__name__}: {exc}"
    return None
