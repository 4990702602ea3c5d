"""Podman as a Docker-API engine: its service's socket, and where podman 4 differs from Docker.

The container code of skyrl-sandbox runs unchanged; the quirks below make its containers what Docker's
are (the same limits, the same read-only file system) and read back what podman does not report.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from skyrl_sandbox.container_engine import ContainerEngine

from .service import HOST_ENV, ServiceError, container_ulimits, ensure_service

# Where podman looks for the init of ``init=True`` containers (its containers.conf ``init_path`` default).
CATATONIT_PATHS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
# Paths podman mounts a writable tmpfs over in a read-only-root container (Docker mounts none there).
WRITABLE_BY_DEFAULT = ("/var/tmp", "/run")
CLOSED_TMPFS = "ro,nosuid,nodev,noexec,size=4k"
CGROUP_V2 = Path("/sys/fs/cgroup/cgroup.controllers")  # there only on a unified (v2) hierarchy
DEFAULT_HEALTH_INTERVAL_NS = 30 * 10**9  # Docker's and podman's default healthcheck interval


class PodmanEngine(ContainerEngine):
    name = "podman"
    title = "podman service"
    sdk_hint = "pip install skyrl-sandbox-podman"

    def __init__(self) -> None:
        super().__init__()
        self._checked: dict[str, float] = {}  # container id -> when its healthcheck last ran here

    def host(self) -> str:
        """``$SKYRL_PODMAN_HOST``, else this machine's service (started on first use; raises ServiceError)."""
        return os.environ.get(HOST_ENV) or ensure_service()

    def problem(self) -> str | None:
        if not os.environ.get(HOST_ENV):
            local = local_problem()
            if local:
                return local
            try:
                ensure_service()
            except ServiceError as exc:
                return str(exc)
        return super().problem()

    def adjust_host_config(self, settings: dict[str, Any]) -> dict[str, Any]:
        """nofile and nproc stated (any ulimit given replaces all of podman's defaults, whose values would not
        start anyway), the tmpfs podman adds to a read-only root closed again, the joined container's hosts file,
        and Docker's ``local`` log driver (which podman lacks) replaced by ``k8s-file`` with the same size cap."""
        from docker.types import LogConfig, Mount, Ulimit

        given = list(settings.get("ulimits") or [])
        named = {ulimit["Name"] for ulimit in given}
        given += [Ulimit(name=name, soft=soft, hard=hard)
                  for name, (soft, hard) in container_ulimits().items() if name not in named]
        adjusted = {**settings, "ulimits": given}
        if settings.get("read_only"):
            adjusted["tmpfs"] = {**{path: CLOSED_TMPFS for path in WRITABLE_BY_DEFAULT}, **(settings.get("tmpfs") or {})}
        joined = (settings.get("network_mode") or "").partition("container:")[2]
        if joined:  # Docker shares the hosts file of the container whose network it joins, podman writes its own
            hosts = self.shared_client().api.inspect_container(joined)["HostsPath"]
            adjusted["mounts"] = [*(settings.get("mounts") or []), Mount("/etc/hosts", hosts, type="bind", read_only=True)]
        log = settings.get("log_config")
        if log is not None and log["Type"] == "local":
            cap = {key: value for key, value in log["Config"].items() if key == "max-size"}
            adjusted["log_config"] = LogConfig(type="k8s-file", config=cap)
        return adjusted

    def oom_killed(self, api: Any, container_id: str) -> bool:
        """Podman's own flag, else the kernel's log: on cgroup v1 podman never sets ``OOMKilled``, and the
        container's cgroup (whose ``memory.oom_control`` counts kills) is gone once it has exited."""
        return super().oom_killed(api, container_id) or kernel_logged_oom(container_id)

    def adjust_healthcheck(self, check: dict[str, Any]) -> dict[str, Any]:
        """Podman 4's Docker API splits a ``CMD`` check's arguments again at spaces (``python3 -c "import x"``
        runs ``import``): the same command as one ``CMD-SHELL`` line, quoted, arrives whole."""
        test = list(check["test"])
        if test[0] != "CMD":
            return check
        return {**check, "test": ["CMD-SHELL", shlex.join(test[1:])]}

    def health(self, api: Any, container_id: str, state: dict[str, Any]) -> str | None:
        """Podman runs healthchecks from systemd timers, so without systemd they never run: run the check here
        (podman's API for one run, which keeps the failing streak and the log) once per interval, the first one
        interval after the first look, as Docker does. The answer is ``state``'s: a run shows in the next inspect."""
        import docker

        status = super().health(api, container_id, state)
        if status is None or not state.get("Running"):
            return status
        check = api.inspect_container(container_id)["Config"].get("Healthcheck") or {}
        interval_s = (check.get("Interval") or DEFAULT_HEALTH_INTERVAL_NS) / 1e9
        now = time.monotonic()
        if now - self._checked.setdefault(container_id, now) >= interval_s:
            self._checked[container_id] = now
            try:
                api._result(api._get(api._url("/libpod/containers/{0}/healthcheck", container_id)))
            except docker.errors.APIError:  # it stopped meanwhile: the caller's next inspect says so
                pass
        return status

    def after_import(self, api: Any, response: Any, tag: str) -> None:
        """Podman's import names the image ``<repository>:latest`` whatever tag was asked: tag it as asked."""
        image_id = next(json.loads(line)["id"] for line in str(response).splitlines() if '"id"' in line)
        repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        api.tag(image_id, repository, version)
        if version != "latest":
            api.remove_image(f"{repository}:latest")  # only the stray name: the image keeps the tag asked for


def local_problem() -> str | None:
    """What this machine lacks to run the service and its containers as this backend needs them."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman catatonit)"
    if not any(Path(path).exists() for path in CATATONIT_PATHS):
        return "catatonit, the init of podman's containers, is not installed (apt-get install catatonit)"
    if os.geteuid() != 0 and not CGROUP_V2.exists():
        return ("rootless podman on cgroup v1 ignores memory, CPU and pids limits: run as root, or on a host with "
                "cgroup v2")
    return None


def kernel_logged_oom(container_id: str) -> bool:
    """Whether the kernel log has an OOM kill in this container's memory cgroup (False where it cannot be read)."""
    pattern = re.compile(rb"oom-kill:.*oom_memcg=\S*libpod-" + container_id.encode())
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: records were overwritten while reading; read on
                continue
            if pattern.search(record):
                return True
    finally:
        os.close(fd)
