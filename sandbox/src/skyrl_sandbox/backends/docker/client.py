"""Docker's engine: which one to talk to (``DOCKER_HOST``, the default socket, or the one setup.sh starts)."""

from __future__ import annotations

import os
from pathlib import Path

from ...container_engine import ContainerEngine, socket_accepts

# Where scripts/setup.sh starts an engine of its own when none answers (data, socket and log live there).
SKYRL_DOCKER_SOCKET = Path("/var/lib/skyrl-docker/docker.sock")


def docker_host() -> str | None:
    """The engine to talk to: DOCKER_HOST, else the default socket, else the one setup.sh starts.

    Of the two sockets, one that accepts connections wins over one left behind by a stopped engine.
    """
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    present = [path for path in (Path("/var/run/docker.sock"), SKYRL_DOCKER_SOCKET) if path.exists()]
    for path in present:
        if socket_accepts(path):
            return f"unix://{path}"
    return f"unix://{present[0]}" if present else None


class DockerEngine(ContainerEngine):
    name = "docker"
    title = "Docker Engine"

    def host(self) -> str | None:
        return docker_host()


DOCKER = DockerEngine()
