"""The Docker backend: a real Docker Engine through the ``docker`` SDK (optional extra)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Where scripts/setup.sh starts an engine of its own when none answers (data, socket and log live there).
SKYRL_DOCKER_SOCKET = Path("/var/lib/skyrl-docker/docker.sock")


def docker_host() -> str | None:
    """The engine to talk to: DOCKER_HOST, else the default socket, else the one setup.sh starts."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    if Path("/var/run/docker.sock").exists():
        return "unix:///var/run/docker.sock"
    if SKYRL_DOCKER_SOCKET.exists():
        return f"unix://{SKYRL_DOCKER_SOCKET}"
    return None


def client() -> Any:
    """A connected ``docker.DockerClient``; raises ImportError or the SDK's error when that fails."""
    import docker

    host = docker_host()
    return docker.DockerClient(base_url=host) if host else docker.from_env()


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
