"""The container :class:`~skyrl_sandbox.machine.Machine` of every Docker-API backend: one container of a task image,
driven by the engine's exec.

Commands are execs of the engine (a shell's is an exec with a tty). Processes are killed from the
host through the container's cgroup: the group is frozen, every member but ``docker-init`` (PID 1)
and the container's main process gets SIGKILL, the group thaws, and the kill holds once the group
lists only those two (``cgroup.procs`` lists a leader whose threads still run, and no zombie). Where this process cannot see the engine's cgroups (an
engine on another host), the container is restarted instead: its PID namespace ends with its init,
and everything in it with the namespace. The agent user is created at start (``useradd``,
``adduser`` or a line in ``/etc/passwd``) and given the work directory.
"""

from __future__ import annotations

import asyncio
import io
import logging
import posixpath
import socket
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import cgroups
from ...container_engine import ContainerEngine
from ...demux import STREAM_HEADER
from ...errors import BackendUnavailable, ProcessesSurvived, SandboxError
from ...machine import AGENT_UID, Machine, MachineSpec, base_env
from ...run_result import RunResult
from ...sidecars import host_entries
from ...terminal import SHELL_ARGV, TerminalSession
from .sidecars import Sidecars
from .worker import owner_labels, remove_container, sweep_once

log = logging.getLogger(__name__)

ROOT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID"]
_KEEPALIVE = ["sleep", "infinity"]
_KILL_WAIT_S = 10.0
_SETUP = r"""
set -e
user=$1; workdir=$2; uid=$3
mkdir -p "$workdir" /logs/verifier /logs/agent
chmod 755 /logs /logs/verifier
if [ "$user" != root ] && ! id "$user" >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then
    useradd -m -u $uid -s /bin/bash "$user" 2>/dev/null || useradd -m -s /bin/bash "$user"
  elif command -v adduser >/dev/null 2>&1; then
    adduser -D -u $uid -s /bin/bash "$user" 2>/dev/null || adduser -D -s /bin/bash "$user"
  else
    echo "$user:x:$uid:$uid::/home/$user:/bin/bash" >> /etc/passwd
    echo "$user:x:$uid:" >> /etc/group
  fi
fi
home=$(getent passwd "$user" 2>/dev/null | cut -d: -f6 || true)
[ -n "$home" ] || home=$( [ "$user" = root ] && echo /root || echo "/home/$user")
mkdir -p "$home"
if [ "$user" != root ]; then chown -R "$user": "$workdir" "$home" /logs/agent; fi
printf '%s %s %s\n' "$(id -u "$user")" "$(id -g "$user")" "$home"
"""
# The fields after the process's name, which the agent chooses (spaces and ")" included), so they are read after
# the name's last ")": state ppid pgrp session tty_nr tpgid. Kills the terminal's foreground group unless it is
# the shell's own; never a group number of 1 or less ("kill -9 -1" would signal every process).
_FOREGROUND = r"""
stat=$(cat "/proc/$1/stat") || exit 1
set -- ${stat##*) }
[ "$6" -gt 1 ] && [ "$6" != "$3" ] && kill -9 "-$6"
"""


class ContainerMachine(Machine):
    def __init__(self, engine: ContainerEngine, backend: str, container_id: str, spec: MachineSpec,
                 warnings: list[str]) -> None:
        self.engine = engine
        self.backend = backend
        self.api = engine.shared_client().api
        self.container_id = container_id
        self.spec = spec
        self.warnings = warnings
        self.agent_uid = self.agent_gid = 0
        self.agent_home = "/root"
        self._group: Path | None = None  # the container's cgroup, where this process can see it
        self._freezer: Path | None = None  # the file that freezes it
        self._spared: set[int] = set()  # host pids of docker-init and the main process
        self._lock = asyncio.Lock()
        self._shells: list[TerminalSession] = []
        self._closed = False
        self._sweeping = False
        self.sidecars = Sidecars(engine, container_id, spec.sidecars, spec.depends_on, spec.storage_mb)

    @classmethod
    async def start(cls, engine: ContainerEngine, spec: MachineSpec, backend: str) -> ContainerMachine:
        """Start a machine on ``engine``; ``backend`` names it in messages and :attr:`Machine.backend`."""
        if spec.image is None:
            raise ValueError(f"a {backend} machine needs MachineSpec.image")
        container_id, warnings = await asyncio.to_thread(_create, engine, backend, spec)
        machine = cls(engine, backend, container_id, spec, warnings)
        try:
            result = await machine.exec(["sh", "-c", _SETUP, "setup", spec.agent_user, spec.workdir, str(AGENT_UID)], cwd="/",
                                        timeout_s=60)
            fields = result.stdout.decode(errors="replace").split()
            if not result.ok or len(fields) < 3:
                raise SandboxError(f"setting up the container of {spec.image} failed (exit {result.exit_code}): "
                                   f"{(result.stderr or result.stdout).decode(errors='replace')[-1500:]}")
            machine.agent_uid, machine.agent_gid = int(fields[0]), int(fields[1])
            machine.agent_home = fields[2]
            await asyncio.to_thread(machine._find_group)
            if spec.sidecars:
                await asyncio.to_thread(machine.sidecars.start)
        except BaseException:
            await machine.close()
            raise
        return machine

    async def exec(self, argv: list[str], *, user: str = "root", env: Mapping[str, str] | None = None,
                   cwd: str | None = None, stdin: bytes = b"", timeout_s: float = 60.0,
                   max_output_bytes: int = 64 * 1024) -> RunResult:
        home = "/root" if user in ("root", "0") else (self.agent_home if user == self.spec.agent_user else "/")
        environment = {**_image_env(self.spec, user, home), **(env or {})}
        async with self._lock:
            result = await asyncio.to_thread(_exec, self.api, self.container_id, argv, user, environment,
                                             cwd or self.spec.workdir, stdin, timeout_s, max_output_bytes)
            if result.timed_out:
                await self._kill_all()
        return result

    async def put_files(self, dest: str, files: Mapping[str, bytes], *, owner: str = "root") -> None:
        uid, gid = (0, 0) if owner in ("root", "0") else (self.agent_uid, self.agent_gid)
        archive = _tar(files, uid, gid)
        made = await self.exec(["mkdir", "-p", dest], cwd="/", timeout_s=30)
        if not made.ok:
            raise SandboxError(f"cannot create {dest}: {made.stderr.decode(errors='replace')[-500:]}")
        if owner not in ("root", "0"):
            await self.exec(["chown", f"{uid}:{gid}", dest], cwd="/", timeout_s=30)
        await asyncio.to_thread(self.api.put_archive, self.container_id, dest, archive)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes | None:
        # Root reads it; a symlink is not followed, neither the file nor a folder on the way (cat -- on a
        # test-only path would), so the agent cannot point a reward file at something else.
        script = ('f=$1; d=${f%/*}; d=${d:-/}; cd -P -- "$d" 2>/dev/null && [ "$(pwd -P)" = "$d" ] && [ -f "$f" ] && '
                  '[ ! -L "$f" ] || exit 3; head -c "$2" -- "$f"')
        result = await self.exec(["sh", "-c", script, "read", posixpath.normpath(path), str(max_bytes)], cwd="/",
                                 timeout_s=30, max_output_bytes=max_bytes)
        return result.stdout if result.exit_code == 0 else None

    async def open_shell(self, *, env: Mapping[str, str] | None = None,
                         max_output_bytes: int = 16 * 1024) -> TerminalSession:
        user = self.spec.agent_user
        environment = {**_image_env(self.spec, user, self.agent_home), **(env or {})}

        async def open_transport() -> _ExecTerminal:
            raw = await asyncio.to_thread(_open_tty_exec, self.api, self.container_id, user, environment, "/")
            reader, writer = await asyncio.open_connection(sock=raw)
            return _ExecTerminal(self, reader, writer)

        return await self._start_shell(open_transport, max_output_bytes)

    async def kill_processes(self) -> None:
        self._sweeping = True  # the shells' terminals need not each kill everything: one sweep follows
        try:
            await self._close_shells()
        finally:
            self._sweeping = False
        async with self._lock:
            await self._kill_all()

    async def _kill_all(self) -> None:
        survivors = await asyncio.to_thread(self._kill_agent_processes)
        if survivors:
            raise ProcessesSurvived(f"processes (host pids {sorted(survivors)}) survived being killed in container "
                                    f"{self.container_id[:12]}", tuple(sorted(survivors)))

    def _find_group(self) -> None:
        """Where the container's cgroup is and which of its processes are the container's own (blocking)."""
        init = int(self.api.inspect_container(self.container_id)["State"]["Pid"])
        group = cgroups.group_of(init)
        if group is None or not cgroups.may_signal(init):
            self.warnings.append("this engine's containers are out of this process's reach (an engine on another host, "
                                 "or a rootless one): the agent's processes are killed by restarting the container, "
                                 "which empties /dev/shm")
            return
        main: set[int] = set()
        for _ in range(500):  # docker-init starts the main process at once; it is the only other member now
            main = cgroups.members(group) - {init}
            if main:
                break
            time.sleep(0.002)
        if len(main) != 1:
            raise SandboxError(f"container {self.container_id[:12]}: expected docker-init and one main process in its "
                               f"cgroup, found {sorted(cgroups.members(group))}")
        self._group, self._freezer, self._spared = group, cgroups.freezer_of(init), {init, *main}

    def _kill_agent_processes(self) -> set[int]:
        """SIGKILL every process but the container's own until its cgroup lists none (blocking); the survivors.

        The container is frozen through its cgroup, not the engine's pause, whose state lags behind (an exec
        right after an unpause can still find the container paused).
        """
        group = self._group
        if group is None:
            self.api.restart(self.container_id, timeout=0)  # the PID namespace, and all in it, ends with its init
            if self.spec.sidecars:
                self.sidecars.restart()  # the restart gave the machine a new network namespace: they join it
            return set()
        return cgroups.kill_until_gone(lambda: cgroups.members(group) - self._spared, self._freezer, _KILL_WAIT_S)

    async def _kill_shell_tree(self) -> None:
        async with self._lock:
            await self._kill_all()

    async def kill_foreground(self, shell_pid: int) -> bool:
        async with self._lock:
            result = await asyncio.to_thread(_exec, self.api, self.container_id,
                                             ["sh", "-c", _FOREGROUND, "fg", str(shell_pid)], "0",
                                             {"PATH": base_env(self.spec, "root", "/root")["PATH"]}, "/", b"", 20.0, 4096)
        return result.exit_code == 0

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for shell in self._shells:
            try:
                await shell.close()
            except Exception:  # noqa: BLE001 - the container goes anyway
                pass
        await asyncio.to_thread(self.sidecars.remove)
        await asyncio.to_thread(remove_container, self.api, self.container_id)


class _ExecTerminal:
    """A shell's tty: the raw stream of a ``docker exec -it``."""

    def __init__(self, machine: ContainerMachine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.machine = machine
        self.reader = reader
        self.writer = writer

    async def read(self) -> bytes:
        try:
            return await self.reader.read(65536)
        except (BrokenPipeError, ConnectionResetError):  # podman breaks the stream of an exec that died: its end
            return b""

    def write(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    async def kill_foreground(self, shell_pid: int) -> bool:
        return await self.machine.kill_foreground(shell_pid)

    async def close(self) -> None:
        self.writer.close()
        # The shell (and what it started) must not outlive its terminal, unless a sweep of everything follows.
        if not (self.machine._closed or self.machine._sweeping):
            try:
                await self.machine._kill_shell_tree()
            except Exception:  # noqa: BLE001 - kill_processes() and close() sweep again
                log.debug("could not kill a closed shell's processes", exc_info=True)


def _image_env(spec: MachineSpec, user: str, home: str) -> dict[str, str]:
    """The base environment without PATH: the image's own PATH (from its Dockerfile) stands."""
    environment = base_env(spec, user, home)
    del environment["PATH"]
    return {**environment, **spec.env}


def _create(engine: ContainerEngine, backend: str, spec: MachineSpec) -> tuple[str, list[str]]:
    """Create and start the container (blocking); returns its id and unmet protections."""
    try:
        import docker
        from docker.types import LogConfig, Ulimit
    except ImportError as exc:
        raise BackendUnavailable(backend, f"the docker SDK is not installed ({engine.sdk_hint})") from exc
    from . import images

    api = engine.shared_client().api
    sweep_once(engine)
    if not images.image_exists(engine, spec.image):
        raise SandboxError(f"Docker image {spec.image!r} is not on this engine, and nothing is pulled: build it first")
    warnings: list[str] = []
    storage_bytes = spec.storage_mb * 2**20
    settings = dict(
        network_mode="none" if not spec.network else "bridge",
        cap_drop=["ALL"], cap_add=ROOT_CAPABILITIES, security_opt=["no-new-privileges"],
        pids_limit=spec.max_processes, mem_limit=spec.memory_mb * 2**20, memswap_limit=spec.memory_mb * 2**20,
        nano_cpus=int(spec.cpus * 1e9), init=True, log_config=LogConfig(type="none"),
        ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="fsize", soft=storage_bytes, hard=storage_bytes)],
        oom_score_adj=500, ipc_mode="private", shm_size=64 * 2**20,
        extra_hosts=host_entries(spec.sidecars) if spec.sidecars else None)  # sidecars share this /etc/hosts
    container_id = None
    for storage_opt in ({"size": f"{spec.storage_mb}m"}, None):
        try:
            config = api.create_host_config(**engine.adjust_host_config(
                {**settings, **({"storage_opt": storage_opt} if storage_opt else {})}))
            container_id = api.create_container(
                spec.image, entrypoint=_KEEPALIVE[:1], command=_KEEPALIVE[1:], user="0:0", working_dir="/",
                hostname=spec.hostname, labels=owner_labels(),
                network_disabled=not (spec.network or spec.sidecars),  # disabled: no /etc/hosts is written
                host_config=config)["Id"]
            api.start(container_id)
            break
        except docker.errors.APIError as exc:
            if container_id is not None:
                remove_container(api, container_id)
                container_id = None
            if storage_opt and "storage" in str(exc).lower():
                warnings.append(f"storage_mb={spec.storage_mb} is not enforced as a disk quota: this engine's storage "
                                "driver has none (each file is still capped at storage_mb)")
                continue
            raise SandboxError(f"could not start a container of {spec.image}: {exc}") from exc
    assert container_id is not None
    return container_id, warnings


def _exec(api: Any, container_id: str, argv: list[str], user: str, env: Mapping[str, str], cwd: str, stdin: bytes,
          timeout_s: float, max_output_bytes: int) -> RunResult:
    """One exec, its demultiplexed output capped per stream, under a deadline (blocking)."""
    import docker

    started = time.monotonic()
    try:
        exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, stdin=bool(stdin), tty=False,
                                  user=user, environment=dict(env), workdir=cwd)["Id"]
        sdk_socket = api.exec_start(exec_id, socket=True)
    except docker.errors.APIError as exc:
        raise SandboxError(f"docker exec of {argv[0]!r} failed: {exc}") from exc
    raw = getattr(sdk_socket, "_sock", sdk_socket)
    streams = {1: bytearray(), 2: bytearray()}
    dropped = {1: 0, 2: 0}
    timed_out = False
    try:
        if stdin:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
        pending = bytearray()
        deadline = started + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            raw.settimeout(left)
            try:
                data = raw.recv(65536)
            except TimeoutError:
                timed_out = True
                break
            if not data:
                break
            pending += data
            while len(pending) >= STREAM_HEADER.size:
                kind, size = STREAM_HEADER.unpack_from(pending)
                if len(pending) < STREAM_HEADER.size + size:
                    break
                chunk = bytes(pending[STREAM_HEADER.size:STREAM_HEADER.size + size])
                del pending[:STREAM_HEADER.size + size]
                target = streams.get(kind)
                if target is None:
                    continue
                room = max(max_output_bytes - len(target), 0)
                target += chunk[:room]
                dropped[kind] += len(chunk) - min(room, len(chunk))
    finally:
        sdk_socket.close()
        if raw is not sdk_socket:
            raw.close()
    exit_code = None if timed_out else _exit_code(api, exec_id)
    return RunResult(exit_code=exit_code, stdout=bytes(streams[1]), stderr=bytes(streams[2]),
                     stdout_truncated=dropped[1] > 0, stderr_truncated=dropped[2] > 0, timed_out=timed_out,
                     duration_s=time.monotonic() - started)


def _exit_code(api: Any, exec_id: str) -> int | None:
    for _ in range(50):  # the stream can close a moment before the engine records the exit
        state = api.exec_inspect(exec_id)
        if not state.get("Running") and state.get("ExitCode") is not None:
            return int(state["ExitCode"])
        time.sleep(0.01)
    return None


def _open_tty_exec(api: Any, container_id: str, user: str, env: Mapping[str, str], cwd: str) -> socket.socket:
    exec_id = api.exec_create(container_id, SHELL_ARGV, stdin=True, stdout=True, stderr=True, tty=True, user=user,
                              environment=dict(env), workdir=cwd)["Id"]
    sdk_socket = api.exec_start(exec_id, socket=True, tty=True)
    raw = getattr(sdk_socket, "_sock", sdk_socket)
    channel = socket.socket(fileno=raw.detach()) if isinstance(raw, socket.socket) else raw
    response = getattr(sdk_socket, "_response", None)
    if response is not None:
        response.close()
    return channel


def _tar(files: Mapping[str, bytes], uid: int, gid: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        made: set[str] = set()
        for name, data in sorted(files.items()):
            relative = posixpath.normpath(name)
            if relative.startswith(("/", "..")) or relative == ".":
                raise SandboxError(f"file name {name!r} must be relative and stay inside the destination")
            parts = relative.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in made:
                    made.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    archive.addfile(info)
            info = tarfile.TarInfo(relative)
            info.size, info.uid, info.gid = len(data), uid, gid
            info.mode = 0o755 if data.startswith(b"#!") else 0o644
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
