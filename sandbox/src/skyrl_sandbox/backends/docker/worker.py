"""The container worker of every Docker-API backend: a real engine through the ``docker`` SDK (optional extra),
reached with the client of its :class:`~skyrl_sandbox.container_engine.ContainerEngine`.

A worker runs as the main process of one container, started from the pool's spawner thread and
driven through the container's own stdin/stdout: the parent attaches to the container before it
starts (one long-lived hijacked connection of the engine's attach API, the stream demultiplexed
here: stdout carries the framed channel, stderr goes to a bounded tail), so a message costs a
write and a read on a socket, never a ``docker exec``.

Each container: no network (``network_mode=none``), read-only root file system, a size-bounded
tmpfs ``/tmp`` as the only writable place (``/dev/mqueue`` is covered read-only, no ``/dev/shm``:
a private IPC namespace), every capability dropped, ``no-new-privileges``, pids/memory/CPU
limits (memory + swap = ``memory_mb + tmp_size_mb``, so tmpfs pages count), a non-root uid of
its own (per-user limits such as RLIMIT_NPROC are counted per uid, and a shared uid would let
one sandbox's threads use up another's), no log driver (the channel never reaches the disk), and
a minimal init (``docker-init``) as PID 1 so that the worker is an ordinary process signals can
kill. The program's packages are bind-mounted read-only at ``/skyrl/lib/<name>``, its read-only
paths at their own path, the worker's inbox at ``/skyrl/inbox``.

Containers carry labels (``skyrl.sandbox=1``, the owner's pid, its start time and its machine)
and are removed on close, on garbage collection and at exit; the first container a process
starts sweeps those of owners that died without cleaning up (e.g. SIGKILL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import weakref
from collections import deque
from pathlib import Path
from typing import Any

from ... import framing
from ...channel import BlockingChannel
from ...container_engine import ContainerEngine
from ...demux import StreamDemux
from ...dirs import make_host_dir, remove_tree
from ...errors import SandboxError, WorkerGone
from ...launch import INSIDE_INBOX, INSIDE_LIB, LaunchPlan, WorkerProgram, clean_env, python_args, spawn_settings
from ...limits import Limits
from ...process import exiting, tree_threads

log = logging.getLogger(__name__)

CONTAINER_PYTHON = "/usr/bin/python3"
LABEL = "skyrl.sandbox"
OWNER_LABEL = "skyrl.sandbox.owner"
OWNER_START_LABEL = "skyrl.sandbox.owner-start"
MACHINE_LABEL = "skyrl.sandbox.machine"
SIDECAR_OF_LABEL = "skyrl.sandbox.sidecar-of"  # on a sidecar: its machine's container id
INIT_TASKS = 1  # docker-init, the container's PID 1, in the container's pids count
CPU_LIMIT_NANOS = 10**9  # one CPU
UID_RANGE = (1_000_000_000, 1_500_000_000)  # per-container uids, far above any host account
_swept: set[tuple[int, int]] = set()


# --- starting a worker ------------------------------------------------------------------------------


def plan_docker(program: WorkerProgram, limits: Limits) -> LaunchPlan:
    """The worker's command line inside the container and the paths it sees there."""
    inside_packages = tuple(f"{INSIDE_LIB}/{name}" for name in program.all_packages)
    argv = python_args(program, CONTAINER_PYTHON, [INSIDE_LIB], spawn_settings(limits, None))
    return LaunchPlan(argv=argv, cwd="/tmp", env=clean_env("/tmp"), inside_tmp="/tmp", inside_inbox=INSIDE_INBOX,
                      inside_read_roots=(*inside_packages, *program.read_only, INSIDE_INBOX))


def container_settings(program: WorkerProgram, limits: Limits, host_dir: Path) -> dict[str, Any]:
    """Keyword arguments of ``APIClient.create_host_config`` for one worker's container."""
    from docker.types import LogConfig, Mount, Ulimit

    mounts = [Mount(f"{INSIDE_LIB}/{name}", str(folder), type="bind", read_only=True)
              for name, folder in program.all_packages.items()]
    mounts += _root_stand_in(program, host_dir)
    mounts += [Mount(path, path, type="bind", read_only=True) for path in program.read_only]
    mounts.append(Mount(INSIDE_INBOX, str(host_dir / "inbox"), type="bind", read_only=True))
    return {
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,noexec,size={limits.tmp_size_mb}m,mode=1777",
                  "/dev/mqueue": "ro,nosuid,nodev,noexec,size=4k"},
        "ipc_mode": "none",  # a private IPC namespace and no /dev/shm
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": limits.max_processes + INIT_TASKS,
        "mem_limit": limits.pinned_memory_bytes,
        "memswap_limit": limits.pinned_memory_bytes,  # equal: no swap
        "nano_cpus": CPU_LIMIT_NANOS,
        "ulimits": [Ulimit(name="core", soft=0, hard=0)],
        "oom_score_adj": 500,  # under host memory pressure, sandboxes go before the trainer
        "init": True,
        "log_config": LogConfig(type="none"),
        "mounts": mounts,
    }


def _root_stand_in(program: WorkerProgram, host_dir: Path) -> list[Any]:
    """An open, empty ``/root`` for a read-only path under the host's ``/root`` (the cache of a run as root).

    The image's ``/root`` is closed (0700) to the worker's uid, so such a path mounted at the same
    place could not be reached. The stand-in is read-only inside, so its mount points are made here first.
    """
    from docker.types import Mount

    under = [Path(path) for path in program.read_only if path.startswith("/root/")]
    if not under:
        return []
    stand_in = host_dir / "root"
    for path in under:
        point = stand_in / path.relative_to("/root")
        point.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            point.mkdir(exist_ok=True)
        else:
            point.touch()
    for folder, _, _ in os.walk(stand_in):
        os.chmod(folder, 0o755)
    return [Mount("/root", str(stand_in), type="bind", read_only=True)]


def start_container_worker(engine: ContainerEngine, program: WorkerProgram, limits: Limits, image: str | None,
                           backend: str) -> ContainerWorker:
    """Create, attach to and start one worker's container on ``engine`` (blocking; the pool calls it from its
    spawner); ``backend`` names the backend in the worker's messages."""
    import docker

    from . import images

    api = engine.shared_client().api
    sweep_once(engine)
    if image is None:
        image = images.ensure_base_image(engine)
    _check_readable(program)
    host_dir = make_host_dir()
    os.chmod(host_dir / "inbox", 0o755)  # the container's uid reads it; the folders above stay private
    uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
    plan = plan_docker(program, limits)
    container_id = None
    try:
        container_id = api.create_container(
            image, plan.argv, user=f"{uid}:{uid}", stdin_open=True, tty=False, environment=plan.env,
            working_dir=plan.cwd, hostname="sandbox", labels=owner_labels(),
            host_config=api.create_host_config(**engine.adjust_host_config(
                container_settings(program, limits, host_dir))))["Id"]
        channel = _attach(engine, api, container_id)  # before start: not a byte of the worker's output is missed
        try:
            api.start(container_id)
            state = api.inspect_container(container_id)["State"]
        except BaseException:
            channel.close()
            raise
    except BaseException as exc:
        if container_id is not None:
            remove_container(api, container_id)
        remove_tree(host_dir)
        if isinstance(exc, docker.errors.ImageNotFound):
            images.forget(engine, image)
            raise SandboxError(f"Docker image {image!r} is not on this engine and nothing is pulled: build it "
                               "(python -m skyrl_sandbox.backends.docker.images, or images.build_image for a task image)") from exc
        if isinstance(exc, (docker.errors.DockerException, OSError)):
            raise SandboxError(f"could not start a sandbox container from {image!r}: {exc}") from exc
        raise
    return ContainerWorker(engine, backend, container_id, plan, host_dir, channel, limits.max_message_bytes,
                           state.get("Pid") or 0, uid)


def _attach(engine: ContainerEngine, api: Any, container_id: str) -> socket.socket:
    """A socket of its own on the container's attach stream (the SDK's objects released, not pooled)."""
    sdk_socket = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
    raw = getattr(sdk_socket, "_sock", sdk_socket)
    if not isinstance(raw, socket.socket) or raw.type != socket.SOCK_STREAM:
        sdk_socket.close()
        raise SandboxError(f"a container backend needs a plain unix or tcp engine socket, not {type(raw).__name__} "
                           f"({engine.host()})")
    channel = socket.socket(fileno=os.dup(raw.fileno()))
    response = getattr(sdk_socket, "_response", None)
    if response is not None:
        response.close()  # closes the SDK's copy of the connection: it can never go back to its pool
    sdk_socket.close()
    return channel


def _check_readable(program: WorkerProgram) -> None:
    for folder in [*program.all_packages.values(), *map(Path, program.read_only)]:
        try:
            mode = folder.stat().st_mode
        except OSError as exc:
            raise SandboxError(f"cannot mount {folder} into the sandbox: {exc}") from exc
        if folder.is_dir() and mode & 0o005 != 0o005:
            raise SandboxError(f"{folder} must be readable by everyone (mode o+rx) to be mounted into a Docker "
                               "sandbox: its worker runs as an unprivileged uid of its own")


# --- ownership and the sweep ---------------------------------------------------------------------


def owner_labels() -> dict[str, str]:
    pid = os.getpid()
    return {LABEL: "1", OWNER_LABEL: str(pid), OWNER_START_LABEL: _start_time(pid) or "", MACHINE_LABEL: machine_id()}


def machine_id() -> str:
    """This kernel boot and PID namespace: owner pids mean something only where both match."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "pid:?"
    return f"{boot}/{namespace.removeprefix('pid:').strip('[]')}"


def _start_time(pid: int) -> str | None:
    """When a process started (clock ticks since boot), which tells a reused pid from its first owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(labels: dict[str, str]) -> bool:
    owner = labels.get(OWNER_LABEL, "")
    if not owner.isdigit():
        return True  # not ours to judge
    started = _start_time(int(owner))
    if started is None:  # no such process (or no /proc to ask: then only whether the pid exists)
        from ...cgroups import alive

        return not Path("/proc/self/stat").exists() and alive(int(owner))
    return labels.get(OWNER_START_LABEL) in (None, "", started)  # a different start time: the pid was reused


def sweep_stale_containers(engine: ContainerEngine) -> list[str]:
    """Remove ``engine``'s containers of owners (on this machine) that died without cleaning up; returns their ids."""
    api = engine.shared_client().api
    found = api.containers(all=True, filters={"label": [f"{LABEL}=1", f"{MACHINE_LABEL}={machine_id()}"]})
    removed = []
    # sidecars before their machines: podman refuses to remove a container whose network namespace others joined
    for container in sorted(found, key=lambda entry: SIDECAR_OF_LABEL not in (entry.get("Labels") or {})):
        if not _owner_alive(container.get("Labels") or {}):
            remove_container(api, container["Id"])
            removed.append(container["Id"])
    if removed:
        log.info("removed %d sandbox container(s) left by owners that died", len(removed))
    return removed


def sweep_once(engine: ContainerEngine) -> None:
    """Sweep dead owners' containers the first time this process uses ``engine``."""
    key = (os.getpid(), id(engine))
    if key in _swept:
        return
    _swept.add(key)
    try:
        sweep_stale_containers(engine)
    except Exception as exc:  # noqa: BLE001 - a failed sweep must not stop new sandboxes
        log.warning("could not sweep stale sandbox containers: %s", exc)


def remove_container(api: Any, container_id: str) -> None:
    """Kill and remove a container and its anonymous volumes (a ``VOLUME`` of its image holds what was written there).

    Idempotent: a container already gone or being removed is fine. Tried again once where podman's kill met the
    container stopping by itself ("container state improper").
    """
    import docker

    for attempt in range(2):
        try:
            api.remove_container(container_id, force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return
            if "state improper" not in str(exc) or attempt:
                log.warning("could not remove sandbox container %s: %s", container_id[:12], exc)
                return


def _remove_all(api: Any, container_id: str, host_dir: Path, channel: socket.socket, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked copy of the owner exiting: the containers are not its to remove
    channel.close()
    remove_container(api, container_id)
    remove_tree(host_dir)


# --- the started worker --------------------------------------------------------------------------


class ContainerWorker:
    """A started worker container, its host folder (the inbox) and, once attached to a loop, its channel.

    Same interface as :class:`skyrl_sandbox.process.WorkerProcess`.
    """

    cgroup = None  # the container's own groups hold the limits (see task_count and describe_exit)

    def __init__(self, engine: ContainerEngine, backend: str, container_id: str, plan: LaunchPlan, host_dir: Path,
                 channel: socket.socket, max_message_bytes: int, init_pid: int, uid: int) -> None:
        self.engine = engine
        self.backend = backend
        self.api = engine.shared_client().api
        self.container_id = container_id
        self.plan = plan
        self.host_dir = host_dir
        self.max_message_bytes = max_message_bytes
        self.uid = uid
        self._init_pid = init_pid
        self._channel = channel
        self._pids_file = _pids_file(init_pid, container_id)
        self._local = self._pids_file is not None or _in_container(init_pid, container_id)
        self._stderr: deque[bytes] = deque()
        self._demux = StreamDemux(self._stderr)
        self._stream: _AttachStream | None = None
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.Transport | None = None
        self._oom_killed = False
        self._status: int | None = None
        # Runs on discard(), on garbage collection and at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _remove_all, self.api, container_id, host_dir, channel, os.getpid())

    @property
    def pid(self) -> int:
        """Host PID of the container's init process (0 where the engine's processes are not visible)."""
        return self._init_pid

    async def attach(self) -> int:
        """Connect the attach stream to the running loop, wait for ``ready``; returns the worker's own pid."""
        loop = asyncio.get_running_loop()
        self._reader = asyncio.StreamReader(limit=2**20)
        self._stream = _AttachStream(self._reader, self._demux)
        self._transport, _ = await loop.create_connection(lambda: self._stream, sock=self._channel)
        ready = await self.receive()
        framing.expect(ready, "ready")
        return framing.int_field(ready, "pid")

    def open_channel(self) -> BlockingChannel:
        """The attach socket as a channel driven from one thread (instead of :meth:`attach`); ``ready`` is its
        first frame."""
        fd = self._channel.fileno()
        return BlockingChannel(fd, fd, self.max_message_bytes, self._demux)

    def running(self) -> bool:
        """Whether the container still runs, as far as this machine sees (a dead one's channel ends either way)."""
        if self._status is not None:
            return False
        return not self._local or not exiting(self._init_pid)

    def reap(self, grace_s: float = 0.0) -> int:
        """:meth:`wait` for callers without an event loop (kill, reap, remove the container; files kept)."""
        if self._status is None:
            if grace_s:
                try:
                    self.api.wait(self.container_id, timeout=grace_s)
                except Exception:  # noqa: BLE001 - still running after the grace (a read time-out), or gone
                    pass
            self._status = self._stop()
        return self._status

    def send(self, message: dict[str, Any]) -> None:
        if self._transport is None or self._transport.is_closing():
            raise WorkerGone("the worker's channel is closed")
        self._transport.write(framing.encode(message))

    async def receive(self) -> dict[str, Any]:
        assert self._reader is not None, "attach() first"
        return await framing.read_message(self._reader, self.max_message_bytes)

    async def has_unread_data(self) -> bool:
        """Whether the worker sent anything on stdout not read yet (buffered here or still in the socket)."""
        assert self._reader is not None and self._stream is not None, "attach() first"
        await asyncio.sleep(0)
        for _ in range(100):  # let the transport move what is in the socket (stderr frames are not unread data)
            if self._channel.fileno() < 0 or not framing.bytes_waiting(self._channel.fileno()):
                break
            await asyncio.sleep(0)
        # StreamReader has no public count of buffered bytes.
        return self._demux.stdout_pending or bool(self._reader._buffer)  # type: ignore[attr-defined]

    def task_count(self) -> int:
        """Threads and processes in the container now (docker-init included), counted from outside."""
        if self._pids_file is not None:
            try:
                return int(self._pids_file.read_text())
            except (OSError, ValueError):
                pass
        if self._local:
            return tree_threads(self._init_pid)
        try:  # an engine whose processes this machine cannot see: ask it
            stats = self.api.stats(self.container_id, stream=False, one_shot=True)
            return int(stats["pids_stats"]["current"])
        except Exception:  # noqa: BLE001 - a stopped container has no count
            return 0

    def write_inbox(self, name: str, data: bytes) -> str:
        """Put a file where the worker can read it; returns its path as the worker sees it."""
        path = self.host_dir / "inbox" / name
        path.write_bytes(data)
        path.chmod(0o644)
        return f"{self.plan.inside_inbox}/{name}"

    def kill(self) -> None:
        """SIGKILL the container (idempotent); reap and remove with :meth:`wait`."""
        import docker

        if self._transport is not None:
            self._transport.close()
        try:
            self.api.kill(self.container_id)
        except docker.errors.APIError:
            pass  # not running any more, or already removed

    def discard(self) -> None:
        """Kill and remove the container and the host folder, blocking (for idle workers never attached)."""
        if self._transport is not None:
            self._transport.close()
        self._finalizer()

    async def wait(self, grace_s: float = 0.0, keep_files: bool = False) -> int:
        """Give the worker ``grace_s`` to exit by itself, then kill, reap and remove the container.

        Returns the exit status (128 + signal number for a signal). ``keep_files`` leaves the host
        folder for :meth:`discard` to remove; the stderr tail is kept in memory either way.
        """
        if grace_s and self._stream is not None:
            try:
                await asyncio.wait_for(self._stream.closed.wait(), grace_s)
            except asyncio.TimeoutError:
                pass
        if self._transport is not None:
            self._transport.close()
        if self._status is None:
            self._status = await asyncio.to_thread(self._stop)
        if not keep_files:
            self._finalizer()
        return self._status

    def _stop(self) -> int:
        import docker

        try:
            self.api.kill(self.container_id)
        except docker.errors.APIError:
            pass
        try:
            status = int(self.api.wait(self.container_id, timeout=30)["StatusCode"])
            self._oom_killed = self.engine.oom_killed(self.api, self.container_id)
        except Exception:  # noqa: BLE001 - removed under us (e.g. by discard): the worker is gone either way
            status = 137
        remove_container(self.api, self.container_id)
        return status

    def stderr_tail(self, limit: int = 2000) -> str:
        data = b"".join(self._stderr)[-limit:]
        return data.decode("utf-8", "replace").strip()

    def describe_exit(self, status: int | None) -> str:
        """Why the worker ended, in words (the engine reports a signal death as 128 + signal number)."""
        if self._oom_killed:
            return "was killed by the kernel at the container's memory limit (memory_mb + tmp_size_mb)"
        if status is None:
            return "is no longer responding"
        if status > 128:
            import signal

            number = status - 128
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
            reason = {"SIGXCPU": " (CPU time limit reached)", "SIGKILL": " (killed)",
                      "SIGSEGV": " (crashed)"}.get(name, "")
            return f"was terminated by {name}{reason}"
        return f"exited with status {status}"


class _AttachStream(asyncio.Protocol):
    """The attach stream on a loop: stdout feeds the channel's reader (which pauses the socket when it
    holds too much), stderr becomes the bounded tail (see :class:`~skyrl_sandbox.demux.StreamDemux`)."""

    def __init__(self, reader: asyncio.StreamReader, demux: StreamDemux) -> None:
        self.reader = reader
        self.demux = demux
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.reader.set_transport(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        stdout = self.demux.feed(data)
        if stdout:
            self.reader.feed_data(stdout)

    def eof_received(self) -> bool:
        return False  # close the transport: the container's output has ended

    def connection_lost(self, exc: Exception | None) -> None:
        self.reader.feed_eof()
        self.closed.set()


def _pids_file(init_pid: int, container_id: str) -> Path | None:
    """The container's ``pids.current`` where this machine sees the engine's processes and cgroups."""
    if not init_pid:
        return None
    try:
        lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue
        if "pids" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/pids", path.lstrip("/"), "pids.current")
        elif controllers == "":
            candidate = Path("/sys/fs/cgroup", path.lstrip("/"), "pids.current")
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def _in_container(init_pid: int, container_id: str) -> bool:
    """Whether ``init_pid`` on this machine is the container's process (same kernel and PID namespace)."""
    try:
        return init_pid > 0 and container_id in Path(f"/proc/{init_pid}/cgroup").read_text()
    except OSError:
        return False
