"""A machine: a whole Linux system for an agent to work in (a container, or a bwrap sandbox without Docker).

A :class:`Machine` is what terminal tasks need beyond a :class:`~skyrl_sandbox.Box`: a persistent
shell as an unprivileged agent user (:meth:`Machine.open_shell`), one-shot commands as root or any
user (:meth:`Machine.exec`, e.g. a verifier), files copied in and out, and
:meth:`Machine.kill_processes`, after which nothing the agent started is running. Limits (CPUs,
memory, processes, storage) and no network hold for everything inside.

- ``docker``: a container of the task's image, ``docker-init`` as PID 1 and a sleeping main process;
  every capability dropped except those root needs to administer files and users (chown, DAC
  override, fowner, fsetid, kill, setuid, setgid), ``no-new-privileges`` (setuid binaries gain
  nothing), no network unless asked, a pids, memory and CPU quota, a file-size limit, and a
  storage quota where the engine's storage driver supports one.
- ``bwrap``: the host's system directories read-only plus a few writable folders of this machine
  (the work directory, the agent's home, ``/logs``, ``/tests``, ``/solution``); the shell runs in
  one sandbox instance and every ``exec`` in a fresh one, all in the machine's cgroups, so killing
  the shell's instance kills everything the agent started. For tasks that need nothing beyond the
  host's tools.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from .run_result import RunResult
from .sidecars import SidecarSpec, start_order
from .terminal import TerminalSession, TerminalTransport

AGENT_UID = 1000
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class MachineSpec:
    """What to start and the limits that bind it."""

    image: str | None = None  # docker: the image (bwrap: the host's system is the image)
    workdir: str = "/app"
    agent_user: str = "agent"  # the shell's user, created when missing; "root" gives the agent root
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 4096
    max_processes: int = 512
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # added to every command's environment
    hostname: str = "task"
    # docker: service containers in the machine's network namespace, reached by name (see .sidecars), and the
    # conditions on them (name -> service_started | service_healthy | service_completed_successfully) that hold
    # before start() returns
    sidecars: tuple[SidecarSpec, ...] = ()
    depends_on: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sidecars or self.depends_on:
            start_order(self.sidecars, self.depends_on)  # names, conditions and cycles: ValueError
        if not self.workdir.startswith("/"):
            raise ValueError(f"MachineSpec.workdir must be absolute, got {self.workdir!r}")
        for name in ("memory_mb", "storage_mb", "max_processes"):
            if getattr(self, name) < 1:
                raise ValueError(f"MachineSpec.{name} must be positive")
        if self.cpus <= 0:
            raise ValueError("MachineSpec.cpus must be positive")

    @property
    def agent_is_root(self) -> bool:
        return self.agent_user in ("root", "0")


def base_env(spec: MachineSpec, user: str, home: str) -> dict[str, str]:
    """The environment every command starts from: nothing of the parent's, the spec's ``env`` on top."""
    return {"PATH": SYSTEM_PATH, "HOME": home, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8", "TERM": "dumb",
            "PAGER": "cat", "GIT_PAGER": "cat", **spec.env}


class Machine(abc.ABC):
    """A started machine; always :meth:`close` it (containers and folders are removed)."""

    backend: str
    spec: MachineSpec
    warnings: list[str]  # protections this machine could not apply, in words
    _shells: list[TerminalSession]  # open shells, closed by kill_processes()

    @abc.abstractmethod
    async def exec(self, argv: list[str], *, user: str = "root", env: Mapping[str, str] | None = None,
                   cwd: str | None = None, stdin: bytes = b"", timeout_s: float = 60.0,
                   max_output_bytes: int = 64 * 1024) -> RunResult:
        """Run one command to completion (``env`` replaces the base environment's keys it names).

        A time-out kills every process of the machine (but the machine itself) and is reported in the
        result, never raised (but :class:`~skyrl_sandbox.errors.ProcessesSurvived` when that kill does not hold).
        """

    @abc.abstractmethod
    async def put_files(self, dest: str, files: Mapping[str, bytes], *, owner: str = "root") -> None:
        """Create ``dest`` (absolute) and write ``files`` (relative path -> bytes) under it, owned by ``owner``.

        Files starting with ``#!`` are executable.
        """

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes | None:
        """A file's first ``max_bytes`` bytes, or None when it is missing or not a regular file."""

    @abc.abstractmethod
    async def open_shell(self, *, env: Mapping[str, str] | None = None,
                         max_output_bytes: int = 16 * 1024) -> TerminalSession:
        """A started persistent shell as the agent user in the work directory.

        The shell starts in ``/`` and enters the work directory itself, so a work directory the agent made
        unenterable leaves the next shell in ``/`` instead of failing to start it.
        """

    @abc.abstractmethod
    async def kill_processes(self) -> None:
        """Kill every process in the machine (shells included) but the machine's own.

        Raises :class:`~skyrl_sandbox.errors.ProcessesSurvived` when the machine's cgroup still lists one after.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop and remove everything (idempotent)."""

    async def _start_shell(self, open_transport: Callable[[], Awaitable[TerminalTransport]],
                           max_output_bytes: int) -> TerminalSession:
        session = TerminalSession(open_transport, max_output_bytes=max_output_bytes, workdir=self.spec.workdir)
        await session.start()
        self._shells.append(session)
        return session

    async def _close_shells(self) -> None:
        shells, self._shells = self._shells, []
        for shell in shells:
            await shell.close()

    async def __aenter__(self) -> Machine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
