"""The bwrap :class:`~skyrl_sandbox.machine.Machine`: the host's tools, read-only, and a few folders of its own.

Every command and every shell is a fresh bubblewrap instance (new user, PID, network, IPC, UTS and
mount namespaces; no capabilities; the seccomp filter of the command agent) over the same writable
folders, which live in the machine's private host folder: the work directory, the agent's home,
``/tmp``, ``/logs``, ``/tests`` and ``/solution``. The
rest of the file system is the host's ``/usr`` and library folders, read-only, with a generated
``/etc/passwd`` (an ``agent`` user in the shell's instance, root only in root's) and nothing else
of the host's ``/etc``. All instances join the machine's pids and memory cgroups, so the limits
hold for the machine as a whole. Killing an instance kills its PID namespace, so nothing a shell
started can outlive :meth:`BwrapMachine.kill_processes`.

The storage quota is per file (RLIMIT_FSIZE), not a disk quota: the folders are on the host's
disk. Reported in :attr:`BwrapMachine.warnings`.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from ...cgroups import WorkerCgroup, cgroup_support
from ...dirs import make_host_dir, remove_tree
from ...errors import BackendUnavailable, ProcessesSurvived, SandboxError
from ...machine import AGENT_UID, Machine, MachineSpec, base_env
from ...process import enter_child
from ...run_result import RunResult
from ...seccomp import build_filter
from ...terminal import SHELL_ARGV, TerminalSession
from .plan import bwrap_base_argv
from .probe import bwrap_problem

STANDARD_WRITABLE = ("/tmp", "/logs", "/tests", "/solution")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "nsswitch.conf", "localtime")


class BwrapMachine(Machine):
    backend = "bwrap"

    def __init__(self, spec: MachineSpec, host_dir: Path, cgroup: WorkerCgroup | None, warnings: list[str]) -> None:
        self.spec = spec
        self.host_dir = host_dir
        self.cgroup = cgroup
        self.warnings = warnings
        self.agent_home = "/root" if spec.agent_is_root else f"/home/{spec.agent_user}"
        self.writable = tuple(dict.fromkeys((spec.workdir, self.agent_home, *STANDARD_WRITABLE)))
        self._instances: set[subprocess.Popen] = set()
        self._shells: list[TerminalSession] = []
        self._closed = False

    @classmethod
    async def start(cls, spec: MachineSpec) -> BwrapMachine:
        problem = bwrap_problem()
        if problem:
            raise BackendUnavailable("bwrap", problem)
        if spec.network:
            raise SandboxError("the bwrap machine has no network; a task that needs one needs the docker backend")
        if spec.sidecars:
            raise SandboxError(f"the bwrap machine cannot run sidecars ({', '.join(s.name for s in spec.sidecars)}); "
                               "they need the docker backend")
        if shutil.which("setsid") is None:
            raise BackendUnavailable("bwrap", "setsid (util-linux) is needed to give the shell its terminal")
        host_dir = make_host_dir()
        warnings = [f"storage_mb={spec.storage_mb} is enforced per file only (RLIMIT_FSIZE): the bwrap machine's "
                    "folders are on the host's disk"]
        support = cgroup_support()
        cgroup = None
        if support is not None:
            cgroup = WorkerCgroup(support, spec.max_processes, spec.memory_mb * 2**20)
        else:
            warnings.append("no writable cgroup hierarchy: the process and memory limits of the bwrap machine hold "
                            "per process only (RLIMIT_NPROC does not bind for root)")
        machine = cls(spec, host_dir, cgroup, warnings)
        for folder in machine.writable:
            machine.host_path(folder).mkdir(parents=True, exist_ok=True)
        machine.host_path("/logs/verifier").mkdir(exist_ok=True)
        machine.host_path("/logs/agent").mkdir(exist_ok=True)
        etc = host_dir / "etc"
        etc.mkdir()
        users = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        (etc / "passwd-root").write_text(users)
        (etc / "group-root").write_text("root:x:0:\nnogroup:x:65534:\n")
        if not spec.agent_is_root:
            users += f"{spec.agent_user}:x:{AGENT_UID}:{AGENT_UID}::{machine.agent_home}:/bin/bash\n"
        (etc / "passwd-agent").write_text(users)
        (etc / "group-agent").write_text(f"root:x:0:\nnogroup:x:65534:\n{spec.agent_user}:x:{AGENT_UID}:\n")
        return machine

    def host_path(self, path: str) -> Path:
        """Where an absolute path of a writable folder lives on the host (SandboxError outside them)."""
        normal = posixpath.normpath(path)
        for root in self.writable:
            if normal == root or normal.startswith(root.rstrip("/") + "/"):
                return self.host_dir / "fs" / normal.lstrip("/")
        raise SandboxError(f"{path} is outside the bwrap machine's writable folders ({', '.join(self.writable)})")

    def _open_folder(self, path: str, create: bool) -> tuple[int, str]:
        """The folder holding ``path`` (opened) and its last name, reached without following a symlink: the
        agent's symlinks point into the host's file system here, not the machine's (SandboxError on one)."""
        self.host_path(path)
        *folders, leaf = posixpath.normpath(path).lstrip("/").split("/")
        fd = os.open(self.host_dir / "fs", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in folders:
                if create:
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    raise SandboxError(f"{path}: /{name} on the way is not a folder of the machine ({exc})") from exc
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd, leaf

    def _argv(self, as_agent: bool, cwd: str, seccomp_fd: int | None) -> list[str]:
        uid = AGENT_UID if as_agent and not self.spec.agent_is_root else 0
        who = "agent" if as_agent else "root"
        argv = bwrap_base_argv(uid, self.spec.hostname)  # no --new-session: the shell's pty is its terminal
        for name in _ETC_FILES:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        argv += ["--ro-bind", str(self.host_dir / "etc" / f"passwd-{who}"), "/etc/passwd",
                 "--ro-bind", str(self.host_dir / "etc" / f"group-{who}"), "/etc/group",
                 # The sandbox's uids map to the host's uid (root, when the host runs as root), and /proc files
                 # such as sysctls (kernel.core_pattern: a program the host kernel runs as root) or
                 # sysrq-trigger check only that uid: /proc is read-only.
                 "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
        for folder in self.writable:
            argv += ["--bind", str(self.host_path(folder)), folder]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return argv + ["--chdir", cwd, "--"]

    def _spawn(self, argv: list[str], as_agent: bool, cwd: str, env: Mapping[str, str], **popen: object
               ) -> subprocess.Popen:
        program = build_filter(allow_subprocesses=True)
        read_fd = None
        if program is not None:
            read_fd, write_fd = os.pipe()
            os.write(write_fd, program)
            os.close(write_fd)
        fsize = self.spec.storage_mb * 2**20
        cgroup = self.cgroup

        def enter_limits() -> None:  # in the child, before bwrap runs
            enter_child(cgroup)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        try:
            process = subprocess.Popen(self._argv(as_agent, cwd, read_fd) + argv, env=dict(env), cwd=self.host_dir,
                                       start_new_session=True, preexec_fn=enter_limits,
                                       pass_fds=() if read_fd is None else (read_fd,), **popen)  # type: ignore[arg-type]
        finally:
            if read_fd is not None:
                os.close(read_fd)
        self._instances.add(process)
        return process

    def _env(self, as_agent: bool, extra: Mapping[str, str] | None) -> dict[str, str]:
        user = self.spec.agent_user if as_agent else "root"
        home = self.agent_home if as_agent else "/root"
        return {**base_env(self.spec, user, home), **(extra or {})}

    async def exec(self, argv: list[str], *, user: str = "root", env: Mapping[str, str] | None = None,
                   cwd: str | None = None, stdin: bytes = b"", timeout_s: float = 60.0,
                   max_output_bytes: int = 64 * 1024) -> RunResult:
        as_agent = user not in ("root", "0")
        started = time.monotonic()
        process = self._spawn(argv, as_agent, cwd or self.spec.workdir, self._env(as_agent, env),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            outputs, dropped, timed_out = await asyncio.to_thread(_communicate, process, stdin, timeout_s,
                                                                  max_output_bytes)
        finally:
            self._kill(process)
        status = process.returncode
        exit_code = None if timed_out else (128 - status if status is not None and status < 0 else status)
        return RunResult(exit_code=exit_code, stdout=outputs[0], stderr=outputs[1], stdout_truncated=dropped[0] > 0,
                         stderr_truncated=dropped[1] > 0, timed_out=timed_out, duration_s=time.monotonic() - started)

    async def put_files(self, dest: str, files: Mapping[str, bytes], *, owner: str = "root") -> None:
        self.host_path(dest)
        for name, data in files.items():
            relative = posixpath.normpath(name)
            if relative.startswith(("/", "..")) or relative == ".":
                raise SandboxError(f"file name {name!r} must be relative and stay inside the destination")
            folder, leaf = self._open_folder(posixpath.join(dest, relative), create=True)
            try:
                try:
                    if os.path.stat.S_ISLNK(os.lstat(leaf, dir_fd=folder).st_mode):
                        os.unlink(leaf, dir_fd=folder)
                except FileNotFoundError:
                    pass
                fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644,
                             dir_fd=folder)
            except OSError as exc:
                raise SandboxError(f"cannot write {posixpath.join(dest, relative)}: {exc}") from exc
            finally:
                os.close(folder)
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), 0o755 if data.startswith(b"#!") else 0o644)
                handle.write(data)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes | None:
        try:
            folder, leaf = self._open_folder(path, create=False)
        except (SandboxError, OSError):
            return None
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            return None
        finally:
            os.close(folder)
        if not os.path.stat.S_ISREG(os.fstat(fd).st_mode):  # a folder (fdopen would raise), a FIFO, a device
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as handle:
            return handle.read(max_bytes)

    async def open_shell(self, *, env: Mapping[str, str] | None = None,
                         max_output_bytes: int = 16 * 1024) -> TerminalSession:
        async def open_transport() -> _PtyTerminal:
            primary, secondary = os.openpty()
            try:
                process = self._spawn(["setsid", "-c", *SHELL_ARGV], True, "/", self._env(True, env),
                                      stdin=secondary, stdout=secondary, stderr=secondary)
            except BaseException:
                os.close(primary)
                raise
            finally:
                os.close(secondary)
            return _PtyTerminal(self, process, primary)

        return await self._start_shell(open_transport, max_output_bytes)

    async def kill_processes(self) -> None:
        await self._close_shells()
        for process in list(self._instances):
            self._kill(process)
        if self.cgroup is not None:  # each instance's PID namespace died with it; the cgroup proves nothing is left
            survivors = await asyncio.to_thread(self.cgroup.kill_all)
            if survivors:
                raise ProcessesSurvived(f"processes {sorted(survivors)} of the bwrap machine survived being killed",
                                        tuple(sorted(survivors)))

    def _kill(self, process: subprocess.Popen) -> None:
        """SIGKILL an instance (its PID namespace dies with it) and reap it."""
        if process.returncode is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._instances.discard(process)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.kill_processes()
        except SandboxError:
            pass
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_tree(self.host_dir)


class _PtyTerminal:
    """A shell's pseudo-terminal: its primary side here, its bwrap instance."""

    def __init__(self, machine: BwrapMachine, process: subprocess.Popen, primary: int) -> None:
        self.machine = machine
        self.process = process
        self.primary = primary
        os.set_blocking(primary, False)
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(primary, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.primary, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the terminal is gone
            data = b""
        if not data:
            self._loop.remove_reader(self.primary)
        self._queue.put_nowait(data)

    async def read(self) -> bytes:
        return await self._queue.get()

    def write(self, data: bytes) -> None:
        try:
            os.write(self.primary, data)
        except OSError:
            pass  # the shell is gone: the next read says so

    async def kill_foreground(self, shell_pid: int) -> bool:
        try:
            group = os.tcgetpgrp(self.primary)  # in this process's PID namespace
        except OSError:
            return False
        try:
            if group <= 0 or group == os.getsid(group):  # the shell itself (the session's leader) is in front
                return False
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def close(self) -> None:
        self._loop.remove_reader(self.primary)
        self.machine._kill(self.process)
        try:
            os.close(self.primary)
        except OSError:
            pass


def _communicate(process: subprocess.Popen, stdin: bytes, timeout_s: float, limit: int
                 ) -> tuple[tuple[bytes, bytes], tuple[int, int], bool]:
    """Feed stdin and read both streams with a per-stream cap under a deadline (blocking)."""
    import selectors

    outputs = {process.stdout: bytearray(), process.stderr: bytearray()}
    dropped = dict.fromkeys(outputs, 0)
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        for stream in outputs:
            selector.register(stream, selectors.EVENT_READ)
        if stdin:
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        pending = stdin
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return (bytes(outputs[process.stdout]), bytes(outputs[process.stderr])), \
                    (dropped[process.stdout], dropped[process.stderr]), True
            for key, _ in selector.select(min(left, 0.5)):
                if key.fileobj is process.stdin:
                    try:
                        written = os.write(process.stdin.fileno(), pending[:65536])
                        pending = pending[written:]
                    except BrokenPipeError:
                        pending = b""
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                room = max(limit - len(outputs[key.fileobj]), 0)
                outputs[key.fileobj] += chunk[:room]
                dropped[key.fileobj] += len(chunk) - min(room, len(chunk))
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    return (bytes(outputs[process.stdout]), bytes(outputs[process.stderr])), \
        (dropped[process.stdout], dropped[process.stderr]), timed_out
