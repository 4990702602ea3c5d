"""A docker machine's sidecars on the engine: started in ``depends_on`` order, waited for, removed with it.

Each sidecar is a container in the machine's network namespace (``network_mode=container:<machine>``;
the machine itself has only loopback), so it has no route off the box and shares the machine's
``/etc/hosts``, where every sidecar's name is ``127.0.0.1`` (see :mod:`.sidecars`). Hardening as
the machine's where a service allows it: every capability dropped but root's file and user
administration and binding ports below 1024, ``no-new-privileges``, pids, memory and CPU limits,
a file-size limit, ``docker-init`` as PID 1, and the machine's owner labels (the stale-container
sweep removes sidecars of a dead owner too). Unlike the machine, a sidecar keeps a bounded log
(the engine's ``local`` driver, 2 MiB at most), so that a service that fails can say why.

Start: before each sidecar, the conditions it depends on must hold (``service_started``,
``service_healthy``: the engine's own healthcheck reports healthy, ``service_completed_successfully``:
it exited 0); after all, the machine's own conditions; and at the end every sidecar must be up
(healthy where it has a healthcheck, else still running :data:`SETTLE_S` after its start, or exited
0). A sidecar that exits with an error, turns unhealthy or is not ready within its
``ready_timeout_s`` fails the start with a :class:`SidecarError` naming it, with the tail of its
logs and its last health check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ...container_engine import ContainerEngine
from ...errors import SandboxError
from ...sidecars import SidecarSpec, start_order
from .worker import SIDECAR_OF_LABEL, owner_labels, remove_container

SERVICE_LABEL = "skyrl.sandbox.service"  # the sidecar's name
# Root's file and user administration (as the machine's), and ports below 1024 (nginx on 80): the namespace
# has loopback only, so a low port reaches nothing more than a high one.
SIDECAR_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE"]
LOG_OPTIONS = {"max-size": "1m", "max-file": "2"}
LOG_TAIL_LINES = 40
_POLL_S = 0.1
# A sidecar without a healthcheck must still run this long after its start to count as up: one that dies on a
# bad configuration dies within it, and is reported by name instead of failing the tests later.
SETTLE_S = 1.0


class SidecarError(SandboxError):
    """A sidecar would not start or become ready; the message names it and holds the tail of its logs."""

    def __init__(self, message: str, service: str) -> None:
        super().__init__(message)
        self.service = service


class Sidecars:
    """The sidecars of one machine container (blocking methods: call them from a thread)."""

    def __init__(self, engine: ContainerEngine, machine_id: str, sidecars: tuple[SidecarSpec, ...],
                 waits: Mapping[str, str], storage_mb: int) -> None:
        self.engine = engine
        self.api = engine.shared_client().api
        self.machine_id = machine_id
        self.order = start_order(sidecars, waits)
        self.waits = dict(waits)
        self.storage_mb = storage_mb
        self.ids: dict[str, str] = {}  # name -> container id, as soon as it is created
        self._started: dict[str, float] = {}  # name -> when it was (last) started (monotonic)
        self._lock = threading.Lock()
        self._removed = False

    def start(self) -> None:
        """Create and start every sidecar in order, waiting for what each depends on; then check them all."""
        for sidecar in self.order:
            self._wait_for(sidecar.depends_on, f"sidecar {sidecar.name}")
            self._create(sidecar)
            self._run(sidecar)
        self._wait_for(self.waits, "the machine")
        self._settle()

    def restart(self) -> None:
        """Start the sidecars again in the machine's new network namespace (after its container restarted).

        Their processes (and what they held in memory) start over; their files stay.
        """
        for sidecar in reversed(self.order):
            self._kill(sidecar.name)
        for sidecar in self.order:
            self._wait_for(sidecar.depends_on, f"sidecar {sidecar.name}")
            self._run(sidecar)
        self._wait_for(self.waits, "the machine")
        self._settle()

    def remove(self) -> None:
        """Remove every sidecar (idempotent); one still being created is removed as it appears."""
        with self._lock:
            self._removed = True
            ids = list(self.ids.values())
        for container_id in ids:
            remove_container(self.api, container_id)

    # -- the engine ---------------------------------------------------------------------------------

    def _create(self, sidecar: SidecarSpec) -> None:
        from docker.types import LogConfig, Ulimit

        storage = self.storage_mb * 2**20
        config = self.api.create_host_config(**self.engine.adjust_host_config(dict(
            network_mode=f"container:{self.machine_id}", cap_drop=["ALL"], cap_add=SIDECAR_CAPABILITIES,
            security_opt=["no-new-privileges"], pids_limit=sidecar.max_processes,
            mem_limit=sidecar.memory_mb * 2**20, memswap_limit=sidecar.memory_mb * 2**20,
            nano_cpus=int(sidecar.cpus * 1e9), init=True, log_config=LogConfig(type="local", config=LOG_OPTIONS),
            ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="fsize", soft=storage, hard=storage)],
            oom_score_adj=500, ipc_mode="private", shm_size=64 * 2**20)))
        labels = {**owner_labels(), SIDECAR_OF_LABEL: self.machine_id, SERVICE_LABEL: sidecar.name}
        entrypoint = None if sidecar.entrypoint is None else (list(sidecar.entrypoint) or [""])  # [""]: none at all
        with self._lock:
            if self._removed:
                raise SandboxError(f"sidecar {sidecar.name}: the machine was closed while it started")
        try:
            container_id = self.api.create_container(
                sidecar.image, command=None if sidecar.command is None else list(sidecar.command),
                entrypoint=entrypoint, environment=dict(sidecar.env), working_dir=sidecar.working_dir,
                user=sidecar.user or "", labels=labels, host_config=config,
                healthcheck=None if sidecar.healthcheck is None else
                self.engine.adjust_healthcheck(sidecar.healthcheck.to_engine()))["Id"]
        except Exception as exc:  # noqa: BLE001 - the SDK's errors vary; the message is what matters
            raise SidecarError(f"sidecar {sidecar.name}: could not create a container of {sidecar.image}: {exc}",
                               sidecar.name) from exc
        with self._lock:
            self.ids[sidecar.name] = container_id
            removed = self._removed
        if removed:
            remove_container(self.api, container_id)
            raise SandboxError(f"sidecar {sidecar.name}: the machine was closed while it started")

    def _run(self, sidecar: SidecarSpec) -> None:
        try:
            self.api.start(self.ids[sidecar.name])
        except Exception as exc:  # noqa: BLE001 - e.g. its command does not exist in the image
            raise SidecarError(f"sidecar {sidecar.name}: could not start ({exc}){self._logs(sidecar.name)}",
                               sidecar.name) from exc
        self._started[sidecar.name] = time.monotonic()

    def _kill(self, name: str) -> None:
        import docker

        try:
            self.api.kill(self.ids[name])
        except docker.errors.APIError:
            pass  # not running
        try:
            self.api.wait(self.ids[name], timeout=30)
        except Exception:  # noqa: BLE001 - start() reports a container that will not come back
            pass

    # -- waiting ------------------------------------------------------------------------------------

    def _wait_for(self, conditions: Mapping[str, str], who: str) -> None:
        for name, condition in conditions.items():
            self._wait(name, condition, f"{who} depends on it ({condition})")

    def _settle(self) -> None:
        """Every sidecar up: healthy where it has a healthcheck, else running or exited 0."""
        for sidecar in self.order:
            self._wait(sidecar.name, "ready", "every sidecar must be up before the machine is used")

    def _wait(self, name: str, condition: str, why: str) -> None:
        by_name = {sidecar.name: sidecar for sidecar in self.order}
        timeout = by_name[name].ready_timeout_s
        deadline = self._started[name] + timeout
        while True:
            state = self.api.inspect_container(self.ids[name])["State"]
            health = self.engine.health(self.api, self.ids[name], state)
            running = bool(state.get("Running"))
            code = state.get("ExitCode")
            if not running and condition in ("service_completed_successfully", "ready") and code == 0:
                return
            if not running and condition != "service_started":
                died = " (killed at its memory limit)" if self.engine.oom_killed(self.api, self.ids[name]) else ""
                raise self._failure(name, f"exited with status {code}{died}", why)
            if condition == "service_started":
                return
            if condition in ("service_healthy", "ready"):
                if health == "healthy":
                    return
                if health is None and condition == "ready":
                    if time.monotonic() - self._started[name] >= SETTLE_S:
                        return
                    time.sleep(_POLL_S)
                    continue
                if health is None:
                    raise self._failure(name, "has no healthcheck (neither in the task nor in its image), so it "
                                              "can never be healthy", why)
                if health == "unhealthy":
                    raise self._failure(name, "is unhealthy", why, state)
            if time.monotonic() > deadline:
                wanted = {"service_completed_successfully": "complete", "service_healthy": "become healthy",
                          "ready": "become healthy"}[condition]
                raise self._failure(name, f"did not {wanted} within {timeout:g} s (health: {health or '-'})", why,
                                    state)
            time.sleep(_POLL_S)

    def _failure(self, name: str, what: str, why: str, state: Mapping[str, Any] | None = None) -> SidecarError:
        checks = ((state or {}).get("Health") or {}).get("Log") or []
        last = ""
        if checks:
            output = str(checks[-1].get("Output") or "").strip()[-800:]
            last = f"\nits last health check exited {checks[-1].get('ExitCode')}: {output or '(no output)'}"
        return SidecarError(f"sidecar {name} {what}; {why}{last}{self._logs(name)}", name)

    def _logs(self, name: str) -> str:
        try:
            data = self.api.logs(self.ids[name], stdout=True, stderr=True, tail=LOG_TAIL_LINES)
        except Exception:  # noqa: BLE001 - no logs to show is not a second error
            return ""
        text = data.decode("utf-8", "replace").strip()[-3000:]
        return f"\nthe tail of its logs:\n{text}" if text else "\nit wrote nothing to its logs"
