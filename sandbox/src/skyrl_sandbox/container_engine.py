"""A Docker-API container engine: where it listens, a connected client per process, and its quirks.

The container code (workers, machines, sidecars, images under :mod:`skyrl_sandbox.backends.docker`) talks to
an engine only through one of these, so any runtime that serves the Docker Engine API (Docker itself,
podman's ``podman system service``) is a backend: subclass, say where the socket is, and override the
quirks where the runtime differs. The ``docker`` SDK (optional extra) is imported on use only.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any


def socket_accepts(path: Path) -> bool:
    """Whether something listens on the unix socket ``path`` (a socket file left by a stopped engine does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class ContainerEngine:
    """One Docker-API engine. Subclasses give :meth:`host` and override the quirks they need."""

    name = "engine"  # the runtime's short name (the backend's, for the built-in one)
    title = "container engine"  # in prose: "no <title> answers"
    sdk_hint = "pip install 'skyrl-sandbox[docker]'"

    def __init__(self) -> None:
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    def host(self) -> str | None:
        """The engine's address (``unix:///path``), or None to let the SDK read the environment."""
        raise NotImplementedError

    def client(self) -> Any:
        """A newly connected ``docker.DockerClient``; raises ImportError or the SDK's error when that fails."""
        import docker

        host = self.host()
        return docker.DockerClient(base_url=host) if host else docker.from_env()

    def shared_client(self) -> Any:
        """This process's client (a forked child makes its own: connections must not be shared)."""
        pid = os.getpid()
        with self._lock:
            if pid not in self._clients:
                self._clients[pid] = self.client()
            return self._clients[pid]

    def problem(self) -> str | None:
        """None when the engine answers; else why not."""
        try:
            import docker  # noqa: F401
        except ImportError:
            return f"the docker SDK is not installed ({self.sdk_hint})"
        try:
            self.client().ping()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the engine is the answer
            return f"no {self.title} answers ({self.host() or 'DOCKER_HOST unset'}): {type(exc).__name__}: {exc}"
        return None

    # Quirks: what differs between runtimes that serve the same API. The defaults are Docker's behaviour.

    def adjust_host_config(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``create_host_config`` for a sandbox container, as this engine needs them."""
        return settings

    def oom_killed(self, api: Any, container_id: str) -> bool:
        """Whether the kernel's OOM killer ended a process of the container."""
        return bool(api.inspect_container(container_id)["State"].get("OOMKilled"))

    def adjust_healthcheck(self, check: dict[str, Any]) -> dict[str, Any]:
        """The ``healthcheck`` argument of ``create_container`` (``test``, ``interval``, ...), as this engine needs it."""
        return check

    def health(self, api: Any, container_id: str, state: dict[str, Any]) -> str | None:
        """The container's health ("starting", "healthy", "unhealthy"; None without a healthcheck), given its
        inspected ``State``."""
        return (state.get("Health") or {}).get("Status") or None

    def after_import(self, api: Any, response: Any, tag: str) -> None:
        """Called with the answer of ``import_image_from_file`` that was asked to create ``tag`` (an engine that does
        not tag imports as asked tags the image here)."""
