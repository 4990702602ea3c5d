"""The podman API service this backend talks to: one per machine, started on first use and left running.

Podman has no daemon; ``podman system service`` serves the Docker Engine API on a socket. Like dockerd
it is machine-wide: every process that sandboxes code shares one, so it is started detached (its own
session, reparented to init) under a file lock, and it outlives the process that started it. It reads a
containers.conf written here (:func:`conf_text`) with a seccomp profile (:func:`seccomp_profile`), and logs to ``service.log`` beside its socket.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from skyrl_sandbox.container_engine import socket_accepts

HOST_ENV = "SKYRL_PODMAN_HOST"  # an engine address (unix:///path) to use instead of starting a service
START_TIMEOUT_S = 20.0
DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")  # podman's (package containers-common)
NAMESPACE_SYSCALLS = ("clone", "clone3", "setns", "unshare")
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: Docker's mask for clone without CAP_SYS_ADMIN
NEW_NAMESPACE_FLAGS = 0x7E020000
NPROC_CEILING = 32768  # podman (4.3, as root) lowers its own RLIMIT_NPROC to this; a container may not ask more


class ServiceError(RuntimeError):
    """The podman service could not be started; the message says why."""


def run_dir() -> Path:
    """Socket, conf, lock and log of the service: /run/skyrl-podman as root, else under the user's runtime dir."""
    if os.geteuid() == 0:
        return Path("/run/skyrl-podman")
    return Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/skyrl-podman-{os.geteuid()}") / "skyrl-podman"


def socket_path() -> Path:
    return run_dir() / "podman.sock"


def container_ulimits() -> dict[str, tuple[int, int]]:
    """nofile and nproc for every container: at most the service's own, since without CAP_SYS_RESOURCE it
    cannot raise them (podman's defaults, 1048576, fail there: the container does not start)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], NPROC_CEILING)
    return {"nofile": (nofile, nofile), "nproc": (nproc, nproc)}


def conf_text(seccomp: Path) -> str:
    """The service's containers.conf.

    ``exit_command_delay``: conmon waits this long before its cleanup command (podman's default of 5 min
    under a long-running service leaves a conmon per exited container behind for as long).
    """
    ulimits = ", ".join(f'"{name}={soft}:{hard}"' for name, (soft, hard) in container_ulimits().items())
    return (f'[containers]\ndefault_ulimits = [{ulimits}]\nseccomp_profile = "{seccomp}"\n\n'
            "[engine]\nexit_command_delay = 5\n")


def seccomp_profile(default: dict[str, Any]) -> dict[str, Any]:
    """Podman's default seccomp profile with Docker's rule for namespaces: without CAP_SYS_ADMIN no ``unshare``,
    no ``clone`` of a new namespace, and ``clone3`` answers ENOSYS (so libc falls back to ``clone``). Podman's
    allows them all (for nested rootless containers): a new user namespace is kernel attack surface."""
    no_admin = {"caps": ["CAP_SYS_ADMIN"]}
    syscalls = [{**rule, "names": [name for name in rule["names"] if name not in NAMESPACE_SYSCALLS]}
                for rule in default["syscalls"]]
    syscalls = [rule for rule in syscalls if rule["names"]]
    syscalls += [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "excludes": no_admin,
         "args": [{"index": 0, "value": NEW_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS, "excludes": no_admin},
        {"names": list(NAMESPACE_SYSCALLS), "action": "SCMP_ACT_ALLOW", "includes": no_admin},
    ]
    return {**default, "syscalls": syscalls}


def ensure_service() -> str:
    """The address of this machine's service, starting it when none answers; raises :class:`ServiceError`."""
    sock = socket_path()
    if socket_accepts(sock):
        return f"unix://{sock}"
    podman = shutil.which("podman")
    if podman is None:
        raise ServiceError("podman is not installed (apt-get install podman catatonit)")
    folder = run_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent first users start one service between them
            if not socket_accepts(sock):
                _start(podman, folder, sock)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ServiceError(f"cannot start `podman system service` in {folder}: {exc}") from exc
    return f"unix://{sock}"


def _start(podman: str, folder: Path, sock: Path) -> None:
    seccomp = folder / "seccomp.json"
    seccomp.write_text(json.dumps(seccomp_profile(json.loads(DEFAULT_SECCOMP.read_text()))))
    conf = folder / "containers.conf"
    conf.write_text(conf_text(seccomp))
    sock.unlink(missing_ok=True)
    log = folder / "service.log"
    with open(log, "ab") as out:
        # setsid --fork: the service is reparented to init, so it is no child (and no zombie) of this process.
        # cwd: conmon leaves files (an "oom" marker after an OOM kill) in the service's working directory.
        subprocess.run(["setsid", "--fork", podman, "system", "service", "--time=0", f"unix://{sock}"],
                       cwd=folder, env={**os.environ, "CONTAINERS_CONF": str(conf)}, stdin=subprocess.DEVNULL,
                       stdout=out, stderr=out, check=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not socket_accepts(sock):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise ServiceError(f"`podman system service` did not answer on {sock} within {START_TIMEOUT_S:.0f} s; "
                               f"{log} ends: {' | '.join(tail) or '(empty)'}")
        time.sleep(0.1)
