"""Sidecars of a container machine (docker, podman): reached by name and on localhost, no route off the box, gone
with the machine.

The specs' checks run anywhere; the rest on each real engine (skipped where none runs, failed under
SKYRL_REQUIRE_<BACKEND>=1), with sidecars of the sandbox base image (python3's http.server as the service).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.backends.docker.sidecars import SERVICE_LABEL, SIDECAR_CAPABILITIES, SIDECAR_OF_LABEL, SidecarError
from skyrl_sandbox.machine import MachineSpec
from skyrl_sandbox.machine_factory import start_machine
from skyrl_sandbox.registry import get_backend, registered
from skyrl_sandbox.sidecars import Healthcheck, SidecarSpec, host_entries, start_order
from skyrl_sandbox.testing import NO_ROUTE_PROBE, require_backend

SERVE = ("python3", "-m", "http.server", "--bind", "127.0.0.1", "8000")
HEALTHY = Healthcheck(("CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8000/')"),
                      interval_s=0.2, timeout_s=5, retries=50)
FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"


def sidecar(name: str = "api", **overrides: Any) -> SidecarSpec:
    settings = {"image": images.BASE_TAG, "command": SERVE, "healthcheck": HEALTHY, "memory_mb": 256,
                "max_processes": 64, **overrides}
    return SidecarSpec(name, **settings)


def spec(*sidecars: SidecarSpec, **overrides: Any) -> MachineSpec:
    return MachineSpec(image=images.BASE_TAG, memory_mb=512, max_processes=128, storage_mb=256, sidecars=sidecars,
                       **overrides)


CONTAINER_BACKENDS = [name for name, backend in registered().items() if backend.engine is not None]


@pytest.fixture(params=CONTAINER_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each container backend in turn, its base image built."""
    require_backend(request.param)
    images.ensure_base_image(get_backend(request.param).engine)
    return request.param


@pytest.fixture
def docker(backend: str) -> Any:
    """The backend's engine's API client."""
    return get_backend(backend).engine.shared_client().api


def in_container(api: Any, container_id: str, argv: list[str]) -> str:
    """Run ``argv`` in a container (a sidecar: not a machine, no exec helper of its own); its output."""
    exec_id = api.exec_create(container_id, argv)["Id"]
    return api.exec_start(exec_id).decode(errors="replace")


def sidecars_of(api: Any, machine_id: str) -> list[dict[str, Any]]:
    return api.containers(all=True, filters={"label": [f"{SIDECAR_OF_LABEL}={machine_id}"]})


def our_containers(api: Any) -> list[dict[str, Any]]:
    """Sandbox containers (machines and sidecars) of this test process: other processes share the engine."""
    from skyrl_sandbox.backends.docker.worker import owner_labels

    return api.containers(all=True, filters={"label": [f"{key}={value}" for key, value in owner_labels().items()]})


# -- the specs ---------------------------------------------------------------------------------------


def test_start_order_puts_each_sidecar_after_what_it_depends_on() -> None:
    web = sidecar("web", depends_on={"db": "service_healthy", "cache": "service_started"})
    order = start_order([web, sidecar("cache"), sidecar("db", depends_on={"cache": "service_started"})])
    assert [s.name for s in order] == ["cache", "db", "web"]
    assert host_entries(order) == {"main": "127.0.0.1", "cache": "127.0.0.1", "db": "127.0.0.1", "web": "127.0.0.1"}


@pytest.mark.parametrize(("sidecars", "waits", "message"), [
    ([sidecar("a", depends_on={"b": "service_started"}), sidecar("b", depends_on={"a": "service_healthy"})], {},
     "cycle: a -> b -> a"),
    ([sidecar("a", depends_on={"nope": "service_started"})], {}, "depends on 'nope', which is not a sidecar"),
    ([sidecar("a"), sidecar("a")], {}, "two sidecars are named 'a'"),
    ([sidecar("a")], {"b": "service_healthy"}, "the machine depends on 'b'"),
    ([sidecar("a")], {"a": "service_ready"}, "condition 'service_ready' is not one of"),
])
def test_bad_dependencies_are_refused_with_what_is_wrong(sidecars: list[SidecarSpec], waits: dict[str, str],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MachineSpec(image="x", sidecars=tuple(sidecars), depends_on=waits)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"name": "Upper"}, "must be a host name"), ({"name": "main"}, "must be a host name"),
    ({"image": ""}, "needs an image"), ({"working_dir": "srv"}, "working_dir must be absolute"),
    ({"depends_on": {"b": "healthy"}}, "condition 'healthy' is not one of"),
])
def test_a_bad_sidecar_spec_names_the_field(overrides: dict[str, Any], message: str) -> None:
    settings = {"name": "api", "image": "x", **overrides}
    with pytest.raises(ValueError, match=message):
        SidecarSpec(**settings)


def test_a_healthcheck_goes_to_the_engine_in_nanoseconds() -> None:
    check = Healthcheck(("CMD-SHELL", "true"), interval_s=0.25, timeout_s=5, retries=4, start_period_s=90)
    assert check.to_engine() == {"test": ["CMD-SHELL", "true"], "interval": 250_000_000, "timeout": 5_000_000_000,
                                 "start_period": 90_000_000_000, "retries": 4}
    assert Healthcheck(("NONE",)).disabled and Healthcheck(("NONE",)).to_engine() == {"test": ["NONE"]}
    with pytest.raises(ValueError, match="CMD, CMD-SHELL or NONE"):
        Healthcheck(("curl", "localhost"))


# -- on the engine -----------------------------------------------------------------------------------


@pytest.mark.docker
async def test_sidecars_are_reached_by_name_and_on_localhost_and_have_no_route_off_the_box(backend: str,
                                                                                        docker: Any) -> None:
    job = SidecarSpec("migrate", images.BASE_TAG, command=("sh", "-c", "echo migrated"), memory_mb=128)
    machine = await start_machine(spec(sidecar("api", depends_on={"migrate": "service_completed_successfully"}),
                                       job, depends_on={"api": "service_healthy"}), backend)
    try:
        api_id = machine.sidecars.ids["api"]
        assert docker.inspect_container(api_id)["State"]["Health"]["Status"] == "healthy"
        for url in ("http://api:8000/", "http://localhost:8000/", "http://127.0.0.1:8000/"):
            fetched = await machine.exec(["python3", "-c", FETCH, url], user="agent")
            assert fetched.stdout == b"200\n", (url, fetched)
        # one network namespace, loopback only: no route, no interface but lo, every address off the box unreachable
        for where in ("machine", "sidecar"):
            if where == "machine":
                route = (await machine.exec(["cat", "/proc/net/route"])).stdout.decode()
                devices = (await machine.exec(["cat", "/proc/net/dev"])).stdout.decode()
                out = (await machine.exec(["python3", "-c", NO_ROUTE_PROBE], timeout_s=30)).stdout.decode()
            else:
                route = in_container(docker, api_id, ["cat", "/proc/net/route"])
                devices = in_container(docker, api_id, ["cat", "/proc/net/dev"])
                out = in_container(docker, api_id, ["python3", "-c", NO_ROUTE_PROBE])
            assert route.strip().splitlines()[1:] == [], (where, route)
            assert [line.split(":")[0].strip() for line in devices.splitlines()[2:]] == ["lo"], (where, devices)
            assert out.split() == ["1.1.1.1", "ENETUNREACH", "10.0.0.1", "ENETUNREACH", "172.17.0.1", "ENETUNREACH",
                                   "192.168.0.1", "ENETUNREACH"], (where, out)
        assert "127.0.0.1\tapi" in in_container(docker, api_id, ["cat", "/etc/hosts"])  # the machine's hosts file
        # hardened as the machine is, and labelled for the sweep
        config = docker.inspect_container(api_id)
        host = config["HostConfig"]
        assert host["NetworkMode"] == f"container:{machine.container_id}"
        # Docker reports ["ALL"], podman each capability it dropped; neither adds more than a sidecar's own
        added = {name.removeprefix("CAP_") for name in host["CapAdd"] or []}
        assert host["CapDrop"] and added <= set(SIDECAR_CAPABILITIES) and "no-new-privileges" in host["SecurityOpt"]
        assert host["PidsLimit"] == 64 and host["Memory"] == 256 * 2**20 and host["Init"] is True
        assert host["LogConfig"]["Type"] in ("local", "json-file")  # podman's k8s-file (size-capped too) reads json-file
        labels = config["Config"]["Labels"]
        assert labels[SIDECAR_OF_LABEL] == machine.container_id and labels[SERVICE_LABEL] == "api"
        assert docker.inspect_container(machine.sidecars.ids["migrate"])["State"]["ExitCode"] == 0
        # the agent's processes are killed, the sidecar keeps running (the tests still reach it)
        await machine.kill_processes()
        assert (await machine.exec(["python3", "-c", FETCH, "http://api:8000/"])).stdout == b"200\n"
    finally:
        await machine.close()
    assert sidecars_of(docker, machine.container_id) == []


@pytest.mark.docker
async def test_a_machine_restarted_to_kill_its_processes_takes_its_sidecars_along(backend: str, docker: Any) -> None:
    machine = await start_machine(spec(sidecar()), backend)
    try:
        machine._group = None  # as where the engine's cgroups are out of reach: the kill restarts the container
        await machine.kill_processes()
        fetched = await machine.exec(["python3", "-c", FETCH, "http://api:8000/"])
        assert fetched.stdout == b"200\n", fetched
    finally:
        await machine.close()


@pytest.mark.docker
@pytest.mark.parametrize(("failing", "words"), [
    (sidecar("flaky", command=("sh", "-c", "echo booting; exec sleep 600"),
              healthcheck=Healthcheck(("CMD-SHELL", "echo not listening; exit 1"), interval_s=0.2, retries=2)),
     ["sidecar flaky is unhealthy", "its last health check exited 1: not listening", "booting"]),
    (sidecar("crashing", command=("sh", "-c", "echo cannot open the database >&2; exit 3")),
     ["sidecar crashing exited with status 3", "cannot open the database"]),
    (sidecar("slow", command=("sleep", "600"), healthcheck=Healthcheck(("CMD", "false"), interval_s=30),
             ready_timeout_s=1.5),
     ["sidecar slow did not become healthy within 1.5 s (health: starting)"]),
    (sidecar("plain", command=("sleep", "600"), healthcheck=None), ["sidecar plain has no healthcheck"]),
])
async def test_a_sidecar_that_fails_fails_the_start_by_name_and_leaves_nothing(backend: str, docker: Any,
                                                                              failing: SidecarSpec,
                                                                              words: list[str]) -> None:
    waits = {failing.name: "service_healthy"} if failing.name == "plain" else {}
    before = {c["Id"] for c in our_containers(docker)}  # other tests' warm workers live in this process too
    with pytest.raises(SidecarError) as raised:
        await start_machine(spec(failing, depends_on=waits), backend)
    assert raised.value.service == failing.name
    for text in words:
        assert text in str(raised.value)
    assert {c["Id"] for c in our_containers(docker)} - before == set()


HOLDER = """
import asyncio, json, sys
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.machine import MachineSpec
from skyrl_sandbox.machine_factory import start_machine
from skyrl_sandbox.registry import get_backend, registered
from skyrl_sandbox.sidecars import SidecarSpec

async def main():
    machine = await start_machine(MachineSpec(image=images.BASE_TAG, memory_mb=256, sidecars=(
        SidecarSpec("api", images.BASE_TAG, command=("sleep", "600"), memory_mb=128),)), sys.argv[1])
    print(json.dumps([machine.container_id, *machine.sidecars.ids.values()]), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.docker
def test_the_sidecars_of_an_owner_that_was_killed_are_swept(backend: str, docker: Any) -> None:
    from skyrl_sandbox.backends.docker.worker import sweep_stale_containers

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, backend], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        ids = json.loads(holder.stdout.readline())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert len(ids) == 2 and all(docker.inspect_container(i)["State"]["Running"] for i in ids)
    swept = sweep_stale_containers(get_backend(backend).engine)
    assert set(ids) <= set(swept)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and set(ids) & {c["Id"] for c in docker.containers(all=True)}:
        time.sleep(0.2)
    assert not set(ids) & {c["Id"] for c in docker.containers(all=True)}


async def test_the_bwrap_machine_refuses_sidecars() -> None:
    require_backend("bwrap")
    from skyrl_sandbox.errors import SandboxError

    with pytest.raises(SandboxError, match=r"cannot run sidecars \(api\); they need the docker backend"):
        await start_machine(MachineSpec(sidecars=(sidecar(),)), "bwrap")
