"""Sidecars: service containers beside a docker machine (an API server, a database), reached by name.

A :class:`SidecarSpec` names a service, its image and how it runs; ``MachineSpec.sidecars`` lists
them. The docker machine starts them (see :mod:`.docker_sidecars`) in the machine's own network
namespace: the machine keeps ``network_mode=none`` (loopback only), every sidecar joins it, and each
sidecar's name resolves to ``127.0.0.1`` in the machine's ``/etc/hosts``, which joined containers
share. So the machine reaches ``http://<name>:<port>`` and ``localhost:<port>``, sidecars reach each
other the same way, and none of them has a route anywhere else. The price of one namespace: two
sidecars cannot listen on the same port.

This module is the plain description (no Docker needed): the specs, their checks and the start
order that ``depends_on`` implies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
MACHINE_NAME = "main"  # the machine itself, as its sidecars' depends_on and /etc/hosts know it
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass(frozen=True)
class Healthcheck:
    """A container healthcheck as the engine runs it.

    ``test``: ``("CMD", argv...)``, ``("CMD-SHELL", command)``, ``("NONE",)`` (the image's own check
    disabled) or ``()`` (the image's test, with these timings). Times are seconds; 0 leaves the
    engine's default (interval and timeout 30 s, 3 retries, no start period).
    """

    test: tuple[str, ...] = ()
    interval_s: float = 0.0
    timeout_s: float = 0.0
    retries: int = 0
    start_period_s: float = 0.0

    def __post_init__(self) -> None:
        if self.test and self.test[0] not in ("CMD", "CMD-SHELL", "NONE"):
            raise ValueError(f"Healthcheck.test must start with CMD, CMD-SHELL or NONE, got {self.test!r}")
        if self.test[:1] == ("CMD-SHELL",) and len(self.test) != 2:
            raise ValueError(f"Healthcheck.test CMD-SHELL takes one command string, got {self.test!r}")
        if self.test[:1] == ("CMD",) and len(self.test) < 2:
            raise ValueError("Healthcheck.test CMD needs a command")
        for name in ("interval_s", "timeout_s", "start_period_s"):
            value = getattr(self, name)
            if value < 0 or (0 < value < 0.001):
                raise ValueError(f"Healthcheck.{name} must be 0 (the default) or at least 1 ms, got {value}")
        if self.retries < 0:
            raise ValueError(f"Healthcheck.retries must not be negative, got {self.retries}")

    @property
    def disabled(self) -> bool:
        return self.test == ("NONE",)

    def longest_wait_s(self) -> float:
        """How long the engine can take to call a failing service unhealthy (its start period and every retry)."""
        interval = self.interval_s or 30.0
        timeout = self.timeout_s or 30.0
        return self.start_period_s + (max(self.retries, 0) or 3) * (interval + timeout) + interval

    def to_engine(self) -> dict[str, object]:
        """The engine API's ``Healthcheck`` (durations in nanoseconds)."""
        config: dict[str, object] = {"test": list(self.test)}
        for key, value in (("interval", self.interval_s), ("timeout", self.timeout_s),
                           ("start_period", self.start_period_s)):
            if value:
                config[key] = int(value * 1e9)
        if self.retries:
            config["retries"] = self.retries
        return config


@dataclass(frozen=True)
class SidecarSpec:
    """One service container beside the machine; it runs as its image says unless told otherwise."""

    name: str  # resolves to 127.0.0.1 in the machine and every sidecar
    image: str  # on the engine already (nothing is pulled)
    command: tuple[str, ...] | None = None  # None: the image's CMD
    entrypoint: tuple[str, ...] | None = None  # None: the image's ENTRYPOINT
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    user: str | None = None  # None: the image's USER
    healthcheck: Healthcheck | None = None  # None: the image's own HEALTHCHECK, if it has one
    depends_on: Mapping[str, str] = field(default_factory=dict)  # sidecar name -> condition (CONDITIONS)
    cpus: float = 1.0
    memory_mb: int = 1024
    max_processes: int = 512
    ready_timeout_s: float = 120.0  # the longest wait for it to start, become healthy or complete

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name) or self.name == MACHINE_NAME:
            raise ValueError(f"sidecar name {self.name!r} must be a host name (lower-case letters, digits, '.', "
                             f"'_', '-', at most 63) other than {MACHINE_NAME!r}")
        if not self.image:
            raise ValueError(f"sidecar {self.name}: needs an image")
        for dependency, condition in self.depends_on.items():
            if condition not in CONDITIONS:
                raise ValueError(f"sidecar {self.name}: depends_on {dependency}: condition {condition!r} is not one "
                                 f"of {', '.join(CONDITIONS)}")
        if self.working_dir is not None and not self.working_dir.startswith("/"):
            raise ValueError(f"sidecar {self.name}: working_dir must be absolute, got {self.working_dir!r}")
        if self.cpus <= 0 or self.memory_mb < 1 or self.max_processes < 1 or self.ready_timeout_s <= 0:
            raise ValueError(f"sidecar {self.name}: cpus, memory_mb, max_processes and ready_timeout_s must be "
                             "positive")


def start_order(sidecars: Sequence[SidecarSpec], waits: Mapping[str, str] | None = None) -> list[SidecarSpec]:
    """The sidecars, each after those it depends on (else in the given order); ValueError on an unknown
    name, a duplicate or a cycle. ``waits`` (the machine's own conditions) must name sidecars too."""
    by_name: dict[str, SidecarSpec] = {}
    for sidecar in sidecars:
        if sidecar.name in by_name:
            raise ValueError(f"two sidecars are named {sidecar.name!r}")
        by_name[sidecar.name] = sidecar
    for name, condition in (waits or {}).items():
        if name not in by_name:
            raise ValueError(f"the machine depends on {name!r}, which is not one of its sidecars "
                             f"({', '.join(by_name) or 'none'})")
        if condition not in CONDITIONS:
            raise ValueError(f"the machine's depends_on {name}: condition {condition!r} is not one of "
                             f"{', '.join(CONDITIONS)}")
    ordered: list[SidecarSpec] = []
    state: dict[str, str] = {}  # name -> "visiting" | "done"

    def visit(sidecar: SidecarSpec, path: tuple[str, ...]) -> None:
        if state.get(sidecar.name) == "done":
            return
        if state.get(sidecar.name) == "visiting":
            cycle = path[path.index(sidecar.name):] + (sidecar.name,)
            raise ValueError(f"sidecars depend on each other in a cycle: {' -> '.join(cycle)}")
        state[sidecar.name] = "visiting"
        for dependency in sidecar.depends_on:
            if dependency not in by_name:
                raise ValueError(f"sidecar {sidecar.name} depends on {dependency!r}, which is not a sidecar "
                                 f"({', '.join(by_name)})")
            visit(by_name[dependency], (*path, sidecar.name))
        state[sidecar.name] = "done"
        ordered.append(sidecar)

    for sidecar in sidecars:
        visit(sidecar, ())
    return ordered


def host_entries(sidecars: Sequence[SidecarSpec]) -> dict[str, str]:
    """The machine's ``/etc/hosts`` additions: every sidecar's name, and the machine's own, on loopback."""
    return {MACHINE_NAME: "127.0.0.1", **{sidecar.name: "127.0.0.1" for sidecar in sidecars}}
