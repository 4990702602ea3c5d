"""Each container backend (docker, podman) on its real engine: container settings, the REPL on it, containment,
channel abuse, sweeping.

Skipped with the reason where no engine answers (or the base image can neither be found nor built);
with SKYRL_REQUIRE_<BACKEND>=1 (CI) that is a failure instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from skyrl_sandbox import (
    BackendUnavailable,
    Limits,
    ProtocolViolation,
    SandboxError,
    WorkerGone,
    WorkerProgram,
    demux,
)
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.backends.docker import worker as container_worker
from skyrl_sandbox.backends.docker.client import DOCKER
from skyrl_sandbox.backends.docker.images import base_image_unavailable
from skyrl_sandbox.registry import get_backend, registered

pytestmark = pytest.mark.docker

REPL_DISABLE_POLICY = ("import gc\n"
                       "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
                       "type(policy).check.__code__ = (lambda self, event, args: None).__code__\n")


CONTAINER_BACKENDS = [name for name, backend in registered().items() if backend.engine is not None]


@pytest.fixture(scope="module", params=CONTAINER_BACKENDS)
def backend(request) -> str:
    """Each container backend in turn: skipped with the reason where it cannot run sandboxes here (no engine, or
    no base image and no way to build it); failed instead under SKYRL_REQUIRE_<BACKEND>=1."""
    problem = base_image_unavailable(get_backend(request.param).engine)
    if problem is not None:
        if os.environ.get(f"SKYRL_REQUIRE_{request.param.upper()}") == "1":
            pytest.fail(f"SKYRL_REQUIRE_{request.param.upper()}=1 but the {request.param} backend cannot run here: "
                        f"{problem}")
        pytest.skip(f"the {request.param} backend cannot run here: {problem}")
    images.ensure_base_image(get_backend(request.param).engine)
    return request.param


@pytest.fixture(scope="module")
def engine(backend):
    return get_backend(backend).engine


@pytest.fixture(scope="module")
def api(engine):
    return engine.shared_client().api


def labelled(api, **labels: str) -> list[dict]:
    wanted = [f"{container_worker.LABEL}=1", *(f"{key}={value}" for key, value in labels.items())]
    return api.containers(all=True, filters={"label": wanted})


# --- a worker program of the tests' own: one scenario per request ------------------------------------

TEST_WORKER = '''
import json, os, socket, threading

from skyrl_sandbox_runtime.channel import Channel


def main(spawn_json):
    spawn = json.loads(spawn_json)
    channel = Channel(os.dup(0), os.dup(1), spawn["max_message_bytes"])
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    channel.send({"op": "ready", "pid": os.getpid()})
    while True:
        try:
            message = channel.receive()
        except EOFError:
            return 0
        reply = SCENARIOS[message["op"]](message, channel)
        if reply is not None:
            channel.send({"op": "reply", **reply})


def echo(message, channel):
    return {"data": message.get("data")}


def identity(message, channel):
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return {"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "ppid": os.getppid(),
            "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip(), "env": dict(os.environ), "cwd": os.getcwd(),
            "ipc_namespace": os.readlink("/proc/self/ns/ipc")}


def writes(message, channel):
    outcome = {}
    for path in message["paths"]:
        try:
            with open(path, "wb") as handle:
                handle.write(b"x" * 1024)
            outcome[path] = "written"
        except OSError as exc:
            outcome[path] = exc.strerror
    return {"outcome": outcome}


def network(message, channel):
    outcome = {"interfaces": [name for _, name in socket.if_nameindex()]}
    for host, port in [("1.1.1.1", 53), ("10.0.0.1", 80), ("172.17.0.1", 2375)]:
        try:
            socket.create_connection((host, port), timeout=1)
            outcome[host] = "connected"
        except OSError as exc:
            outcome[host] = exc.strerror or str(exc)
    try:
        socket.getaddrinfo("example.com", 80)
        outcome["dns"] = "resolved"
    except OSError as exc:
        outcome["dns"] = str(exc)
    return outcome


def threads(message, channel):
    stop, started = threading.Event(), []
    try:
        for _ in range(message["up_to"]):
            thread = threading.Thread(target=stop.wait)
            thread.start()
            started.append(thread)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    stop.set()
    for thread in started:
        thread.join()
    return {"started": len(started), "error": error}


def memory(message, channel):
    hoard = []
    while True:
        hoard.append(bytearray(16 * 2**20))
        hoard[-1][::4096] = b"x" * (16 * 2**20 // 4096)


def raw(message, channel):
    fd = channel._write_fd
    for _ in range(message.get("repeat", 1)):
        os.write(fd, bytes.fromhex(message["hex"]))
    return {}


def stderr_flood(message, channel):
    block = b"e" * 65536
    for _ in range(message["blocks"]):
        os.write(2, block)
    return {"flooded": True}


def stdout_flood(message, channel):
    while True:
        os.write(channel._write_fd, b"A" * 65536)


def leave_frame(message, channel):
    channel.send({"op": "reply"})
    channel.send({"op": "stray"})


def exit_now(message, channel):
    os._exit(message["status"])


def kill_self(message, channel):
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


SCENARIOS = {"echo": echo, "identity": identity, "writes": writes, "network": network, "threads": threads,
             "memory": memory, "raw": raw, "stderr_flood": stderr_flood, "stdout_flood": stdout_flood,
             "leave_frame": leave_frame, "exit": exit_now, "kill_self": kill_self}
'''


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> WorkerProgram:
    package = tmp_path_factory.mktemp("program") / "skyrl_docker_test_worker"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(textwrap.dedent(TEST_WORKER))
    for path in (package, package / "__init__.py", package / "main.py"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return WorkerProgram(module="skyrl_docker_test_worker.main", packages={"skyrl_docker_test_worker": package})


LIMITS = Limits(cpu_time_s=20, memory_mb=256, max_processes=8, tmp_size_mb=8, max_message_mb=1)


@pytest.fixture
async def worker(backend, api, program):
    started = await asyncio.to_thread(get_backend(backend).start_worker, program, LIMITS, None)
    await started.attach()
    yield started
    await started.wait()


async def ask(worker, op: str, **fields) -> dict:
    worker.send({"op": op, **fields})
    return await asyncio.wait_for(worker.receive(), 30)


# --- the container's settings ------------------------------------------------------------------------

async def test_container_settings_lock_the_worker_down(backend, api, program, worker):
    info = api.inspect_container(worker.container_id)
    host, config = info["HostConfig"], info["Config"]
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    # Docker reports ["ALL"], podman each capability it dropped: the worker's own view (CapEff, CapBnd) below is the proof
    assert host["CapDrop"] and not host["CapAdd"] and not host["Privileged"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == LIMITS.max_processes + container_worker.INIT_TASKS
    assert host["Memory"] == host["MemorySwap"] == LIMITS.pinned_memory_bytes
    assert host["NanoCpus"] == container_worker.CPU_LIMIT_NANOS
    assert host["Init"] is True and host["LogConfig"]["Type"] == "none"
    assert f"size={LIMITS.tmp_size_mb}m" in host["Tmpfs"]["/tmp"] and host["Tmpfs"]["/dev/mqueue"].startswith("ro,")
    assert config["Labels"][container_worker.LABEL] == "1"
    assert config["Labels"][container_worker.OWNER_LABEL] == str(os.getpid())
    assert config["Labels"][container_worker.MACHINE_LABEL] == container_worker.machine_id()
    mounts = {mount["Destination"]: mount for mount in info["Mounts"]}
    assert set(mounts) == {"/skyrl/lib/skyrl_sandbox_runtime", "/skyrl/lib/skyrl_docker_test_worker", "/skyrl/inbox"}
    assert not any(mount["RW"] for mount in mounts.values())
    uid, gid = map(int, config["User"].split(":"))
    assert uid == gid >= container_worker.UID_RANGE[0]

    seen = await ask(worker, "identity")
    assert (seen["uid"], seen["gid"]) == (uid, gid)
    assert int(seen["cap_eff"], 16) == int(seen["cap_bnd"], 16) == 0 and seen["no_new_privs"] == "1"
    assert seen["ppid"] == 1 and seen["pid"] != 1  # the engine's init is PID 1: the worker is an ordinary process
    assert seen["cwd"] == "/tmp" and "OPENAI_API_KEY" not in seen["env"] and seen["env"]["HOME"] == "/tmp"
    # IPC mode none (podman reports it as "shareable"): an IPC namespace of its own, and no /dev/shm (tested below)
    assert seen["ipc_namespace"] != os.readlink("/proc/self/ns/ipc")
    assert worker.backend == backend and worker.cgroup is None
    assert worker.plan.inside_read_roots == ("/skyrl/lib/skyrl_sandbox_runtime", "/skyrl/lib/skyrl_docker_test_worker",
                                             "/skyrl/inbox")


async def test_each_container_runs_as_a_uid_of_its_own(backend, program, worker):
    """RLIMIT_NPROC counts per uid: with a shared uid one sandbox's threads would use up another's."""
    other = await asyncio.to_thread(get_backend(backend).start_worker, program, LIMITS, None)
    try:
        assert other.uid != worker.uid
    finally:
        other.discard()


async def test_files_in_the_inbox_are_readable_and_nothing_outside_tmp_is_writable(worker):
    path = worker.write_inbox("data.txt", b"for the worker")
    result = await ask(worker, "writes", paths=["/tmp/ok", "/pwned", "/usr/pwned", "/etc/passwd", path,
                                                "/skyrl/lib/skyrl_docker_test_worker/pwned", "/dev/pwned",
                                                "/dev/shm/pwned", "/dev/mqueue/pwned", "/var/tmp/pwned", "/run/pwned",
                                                "/proc/sys/kernel/hostname"])
    outcome = result["outcome"]
    assert outcome.pop("/tmp/ok") == "written"
    assert outcome.pop("/dev/shm/pwned") == "No such file or directory"  # a private IPC namespace: no /dev/shm
    assert set(outcome.values()) <= {"Read-only file system", "Permission denied"}, outcome
    assert path == "/skyrl/inbox/data.txt" and outcome[path] == "Read-only file system"


async def test_the_container_has_no_network(worker):
    result = await ask(worker, "network")
    assert result.pop("interfaces") == ["lo"]
    assert all(outcome != "connected" and outcome != "resolved" for outcome in result.values()), result


async def test_the_pids_limit_stops_a_thread_bomb(worker):
    """No RLIMIT_NPROC in this program: the container's pids limit alone stops it."""
    result = await ask(worker, "threads", up_to=500)
    # the engine's init and the worker's main thread count too
    assert result["started"] == LIMITS.max_processes - 1 and "can't start new thread" in result["error"]
    assert (await ask(worker, "echo", data="alive"))["data"] == "alive"
    for _ in range(100):  # a joined thread's task may take a moment to leave the kernel
        if worker.task_count() == 2:
            break
        await asyncio.sleep(0.01)
    assert worker.task_count() == 2  # the threads ended: init and the worker


async def test_the_memory_limit_kills_the_container_and_says_so(worker):
    worker.send({"op": "memory"})
    with pytest.raises(WorkerGone):
        await asyncio.wait_for(worker.receive(), 60)
    status = await worker.wait(grace_s=5)
    assert "memory limit" in worker.describe_exit(status)


async def test_exit_status_and_signals_are_reported(backend, api, program):
    for request, expected in [({"op": "exit", "status": 3}, "exited with status 3"),
                              ({"op": "kill_self"}, "terminated by SIGKILL")]:
        worker = await asyncio.to_thread(get_backend(backend).start_worker, program, LIMITS, None)
        await worker.attach()
        worker.send(request)
        with pytest.raises(WorkerGone):
            await asyncio.wait_for(worker.receive(), 30)
        status = await worker.wait(grace_s=5)
        assert expected in worker.describe_exit(status)
        assert worker.container_id not in {c["Id"] for c in labelled(api)}


# --- the channel ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("frame, reason", [
    ("ffffffff", "exceeds the limit"),
    ((2**20 + 1).to_bytes(4, "big").hex(), "exceeds the limit"),
    (len(b"[1]").to_bytes(4, "big").hex() + b"[1]".hex(), "not an object"),
    (len(b"{oops").to_bytes(4, "big").hex() + b"{oops".hex(), "not valid JSON"),
])
async def test_oversized_and_malformed_frames_are_rejected(worker, frame, reason):
    worker.send({"op": "raw", "hex": frame})
    with pytest.raises(ProtocolViolation, match=reason):
        await asyncio.wait_for(worker.receive(), 30)


async def test_a_stdout_flood_is_a_protocol_violation_not_a_memory_bomb(worker):
    worker.send({"op": "stdout_flood"})
    with pytest.raises(ProtocolViolation, match="exceeds the limit"):
        await asyncio.wait_for(worker.receive(), 30)


async def test_a_stderr_flood_costs_the_parent_a_bounded_tail(worker):
    reply = await asyncio.wait_for(ask(worker, "stderr_flood", blocks=800), 60)  # 50 MiB
    assert reply["flooded"] is True
    kept = sum(len(chunk) for chunk in worker._stderr)
    assert kept <= 2 * demux.STDERR_TAIL_BYTES
    assert worker.stderr_tail().endswith("eeee") and len(worker.stderr_tail()) <= 2000
    assert (await ask(worker, "echo", data="still framed"))["data"] == "still framed"


async def test_frames_sent_between_requests_are_seen_as_unread(worker):
    assert not await worker.has_unread_data()
    assert (await ask(worker, "leave_frame"))["op"] == "reply"
    await asyncio.sleep(0.2)
    assert await worker.has_unread_data()
    assert (await worker.receive())["op"] == "stray"
    assert not await worker.has_unread_data()


async def test_a_channel_round_trip_is_fast(worker):
    """Measured, not asserted (the target is p50 <= 2 ms): printed with -s."""
    samples = []
    for _ in range(200):
        started = time.perf_counter()
        await ask(worker, "echo", data="x")
        samples.append(time.perf_counter() - started)
    samples.sort()
    print(f"\n{worker.backend} channel round trip: p50 {samples[100] * 1e3:.3f} ms, p99 {samples[197] * 1e3:.3f} ms")


# --- the REPL in a container ------------------------------------------------------------------------------------

async def test_the_repl_runs_in_a_container(backend, api):
    from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig

    config = SandboxConfig(backend=backend, exec_timeout_s=2.0, pool_size=0)
    started = time.perf_counter()
    async with await Sandbox.create(config, context="public context") as box:
        cold = time.perf_counter() - started
        assert box.backend == backend
        first = box._worker.container_id
        assert (await box.execute("x = 41\nprint(context)")).stdout == "public context\n"
        assert (await box.execute("x + 1")).stdout == "42\n"
        final = await box.execute("FINAL(f'answer {x + 1}')")
        assert final.final_answer == "answer 42" and final.error is None
        stuck = await box.execute("while True:\n    pass")
        assert stuck.timed_out and stuck.sandbox_restarted and "time limit" in stuck.error
        assert box._worker.container_id != first and first not in {c["Id"] for c in labelled(api)}
        after = await box.execute("print(context, 'x' in globals())")
        assert after.stdout == "public context False\n"
        current = box._worker.container_id
    assert current not in {c["Id"] for c in labelled(api)}  # removed on close
    print(f"\n{backend} REPL cold start {cold * 1e3:.0f} ms")


async def test_the_repl_keeps_model_code_inside_even_with_its_policy_disabled(backend, api):
    from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig

    async with await Sandbox.create(SandboxConfig(backend=backend, pool_size=0)) as box:
        result = await box.execute(
            REPL_DISABLE_POLICY + "import os, socket\n"
            "print(os.getuid() != 0, sorted(os.listdir('/skyrl')), open('/proc/1/cmdline').read().split('\\0')[0])\n"
            "for path in ('/pwned', '/skyrl/inbox/pwned', '/usr/lib/pwned'):\n"
            "    try:\n        open(path, 'w')\n    except OSError as exc:\n        print(exc.strerror)\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
            "except OSError as exc:\n    print(exc.strerror)\n")
    assert result.error is None, result.error
    first, *rest = result.stdout.splitlines()
    assert first.startswith("True ['inbox', 'lib'] /") and first.endswith("-init")  # the engine's init is PID 1
    assert rest == ["Read-only file system", "Read-only file system", "Read-only file system", "Network is unreachable"]


async def test_a_task_image_built_offline_runs_the_repl(backend, engine, api, tmp_path):
    from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig

    (tmp_path / "Dockerfile").write_text(f"FROM {images.BASE_TAG}\nCOPY task.txt /opt/task.txt\n"
                                         "RUN python3 -c \"open('/opt/built.txt', 'w').write('built offline')\"\n")
    (tmp_path / "task.txt").write_text("task data")
    tag = "skyrl-sandbox-test-task:1"
    try:
        images.build_image(engine, tmp_path, tag, force=True)
        messages: list[str] = []
        images.build_image(engine, tmp_path, tag, progress=messages.append)
        assert messages == [f"{tag} is up to date with {tmp_path}"]  # cached by the folder's contents
        async with await Sandbox.create(SandboxConfig(backend=backend, image=tag, pool_size=0)) as box:
            result = await box.execute(REPL_DISABLE_POLICY + "print(open('/opt/task.txt').read(), "
                                       "open('/opt/built.txt').read())")
        assert result.stdout == "task data built offline\n"
    finally:
        api.remove_image(tag, force=True)


def test_a_dockerfile_from_an_image_that_is_not_local_is_refused(engine, api, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM registry.example.com/nothing:here\n")
    with pytest.raises(images.ImageBuildError, match=f"not an image on this {engine.title}, and nothing is pulled"):
        images.build_image(engine, tmp_path, "skyrl-sandbox-test-never:1")


def test_building_the_base_image_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(DOCKER, "problem", lambda: "no Docker Engine answers (test)")
    with pytest.raises(BackendUnavailable, match="cannot build Docker Engine images: no Docker Engine answers"):
        images.build_base_image(DOCKER, force=True)
    monkeypatch.setattr(DOCKER, "problem", lambda: None)
    monkeypatch.setattr(images, "image_exists", lambda engine, tag: False)
    monkeypatch.setattr(images.shutil, "which", lambda name: None)
    with pytest.raises(BackendUnavailable, match="mmdebstrap is not installed .*apt-get install mmdebstrap"):
        images.build_base_image(DOCKER)


def test_an_image_that_is_not_there_is_a_clear_error(backend, api, program):
    with pytest.raises(SandboxError, match="not on this engine and nothing is pulled"):
        get_backend(backend).start_worker(program, LIMITS, "skyrl-sandbox-no-such-image:0")


# --- ownership: nothing outlives its owner ----------------------------------------------------------------

HOLDER = """
import asyncio, json, sys
from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig

async def main():
    config = SandboxConfig(backend=sys.argv[1], pool_size=2)
    boxes = [await Sandbox.create(config, context="held") for _ in range(8)]
    for box in boxes:
        assert (await box.execute("print(context)")).stdout == "held\\n"
    print(json.dumps([box._worker.container_id for box in boxes]), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_containers_of_a_sigkilled_owner_are_swept(backend, engine, api, worker):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, backend], stdout=subprocess.PIPE, text=True)
    try:
        held = json.loads(holder.stdout.readline())
        time.sleep(0.5)  # the pool's replacements start too
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    left = labelled(api, **{container_worker.OWNER_LABEL: str(holder.pid)})
    assert set(held) <= {container["Id"] for container in left} and len(left) >= 8  # the owner could not clean up
    removed = container_worker.sweep_stale_containers(engine)
    assert set(held) <= set(removed)
    # A create the owner's spawner sent just before the kill can land in the engine after that sweep
    # listed the containers (seen under load): later sweeps take it, however long the engine takes.
    deadline = time.monotonic() + 120
    while labelled(api, **{container_worker.OWNER_LABEL: str(holder.pid)}) and time.monotonic() < deadline:
        container_worker.sweep_stale_containers(engine)
        time.sleep(0.5)
    assert not labelled(api, **{container_worker.OWNER_LABEL: str(holder.pid)})
    assert worker.container_id in {container["Id"] for container in labelled(api)}  # a live owner's stays


def test_the_first_start_of_a_process_sweeps_dead_owners(backend, api, program):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, backend], stdout=subprocess.PIPE, text=True)
    try:
        held = json.loads(holder.stdout.readline())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    next_start = ("import asyncio\nfrom skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig\n"
                  "async def main():\n"
                  f"    async with await Sandbox.create(SandboxConfig(backend={backend!r}, pool_size=0)) as box:\n"
                  "        print((await box.execute('print(6 * 7)')).stdout.strip())\n"
                  "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", next_start], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "42", done.stderr
    assert not {container["Id"] for container in labelled(api)} & set(held)


def test_a_reused_owner_pid_does_not_keep_containers_alive():
    pid = os.getpid()
    start = container_worker._start_time(pid)
    base = {container_worker.OWNER_LABEL: str(pid)}
    assert container_worker._owner_alive({**base, container_worker.OWNER_START_LABEL: start})
    assert not container_worker._owner_alive({**base, container_worker.OWNER_START_LABEL: str(int(start) - 1)})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not container_worker._owner_alive({container_worker.OWNER_LABEL: str(dead.pid)})
    assert container_worker._owner_alive({container_worker.OWNER_LABEL: "someone else's"})


def test_discard_and_garbage_collection_remove_the_container(backend, api, program):
    worker = get_backend(backend).start_worker(program, LIMITS, None)
    container_id, host_dir = worker.container_id, worker.host_dir
    worker.discard()
    assert container_id not in {c["Id"] for c in labelled(api)} and not host_dir.exists()
    worker = get_backend(backend).start_worker(program, LIMITS, None)
    container_id = worker.container_id
    del worker
    import gc

    gc.collect()
    assert container_id not in {c["Id"] for c in labelled(api)}


def test_pooled_containers_are_removed_when_the_pool_closes(backend, api, program):
    from skyrl_sandbox import WorkerPool

    pool = WorkerPool(program, LIMITS, backend=backend, size=2)
    deadline = time.monotonic() + 30
    while pool.idle_count < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ids = {worker.container_id for worker in pool._idle}
    assert len(ids) == 2 and ids <= {c["Id"] for c in labelled(api)}
    pool.close()
    assert not ids & {c["Id"] for c in labelled(api)}


def test_inbox_folder_is_private_on_the_host(backend, program):
    worker = get_backend(backend).start_worker(program, LIMITS, None)
    try:
        assert oct(Path(worker.host_dir).stat().st_mode & 0o777) == "0o700"
    finally:
        worker.discard()
