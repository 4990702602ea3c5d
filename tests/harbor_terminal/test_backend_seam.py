"""harbor_terminal chooses and uses sandbox backends through the registry and their attributes, never by name:
a third container runtime, registered by its own package, runs harbor tasks with no change to the plugin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harbor_helpers import write_task
from skyrl_harbor_terminal import env as env_module
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.env import HarborTerminalEnv, resolve_backend
from skyrl_harbor_terminal.provision import TaskEnvironmentError, container_runtime, machine_engine
from skyrl_harbor_terminal.task import load_task
from skyrl_harbor_terminal.tests_machine import engine_for_tests
from skyrl_sandbox.backends.docker import ContainerBackend
from skyrl_sandbox.container_engine import ContainerEngine
from skyrl_sandbox.registry import registered

SOURCE = Path(__file__).resolve().parents[2] / "plugins" / "harbor_terminal" / "src" / "skyrl_harbor_terminal"


class PodEngine(ContainerEngine):
    name = "Pod"

    def host(self) -> str | None:
        return "unix:///nonexistent/pod.sock"


@pytest.fixture
def pod(monkeypatch: pytest.MonkeyPatch) -> ContainerBackend:
    """A third image-running backend, installed after the built-in ones (as an entry point of its own would be)."""
    backend = ContainerBackend("pod", PodEngine(), auto_rank=30, protects="a pod", install_hint="start a pod engine")
    monkeypatch.setitem(registered(), "pod", backend)
    return backend


def test_auto_picks_the_first_image_backend_that_works_whatever_its_name(tmp_path: Path, pod: ContainerBackend,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    write_task(tmp_path, {"tests/test.sh": "#!/bin/bash\n"}, base_only=False)
    task = load_task(tmp_path)
    monkeypatch.setattr(env_module, "_image_problem", lambda backend: None if backend == "pod" else "down")
    assert resolve_backend("auto", task) == "pod"
    assert machine_engine("pod") is pod.engine and engine_for_tests(task, "pod") is pod.engine
    assert HarborTerminalConfig(backend="pod").backend == "pod"
    monkeypatch.setattr(env_module, "_image_problem", lambda backend: f"{backend} is down")
    runtimes = [name for name, backend in registered().items() if backend.runs_images]
    assert runtimes[-1] == "pod" and container_runtime() == f"a container runtime ({' or '.join(runtimes)})"
    down = "; ".join(f"{name}: {name} is down" for name in runtimes)
    with pytest.raises(TaskEnvironmentError, match=re.escape(f"needs {container_runtime()} and none works here "
                                                             f"({down})")):
        resolve_backend("auto", task)


def test_auto_falls_back_to_a_backend_of_the_hosts_tools_only_for_base_packages_tasks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_task(tmp_path, {"tests/test.sh": "#!/bin/bash\n"})  # declares base_packages_only
    monkeypatch.setattr(env_module, "_image_problem", lambda backend: "down")
    host = resolve_backend("auto", load_task(tmp_path))
    assert not registered()[host].runs_images and registered()[host].has_machines
    assert machine_engine(host) is None
    with pytest.raises(TaskEnvironmentError, match=f"the {host} backend runs none"):
        engine_for_tests(load_task(tmp_path), host)


def test_ray_resources_of_auto_are_those_of_the_first_image_backend() -> None:
    first = next(name for name, backend in registered().items() if backend.strong and backend.runs_images)
    assert HarborTerminalEnv.ray_resources(HarborTerminalConfig()) == {registered()[first].ray_resource: 1.0}


def test_the_plugin_names_no_backend_in_its_code() -> None:
    names = "|".join(registered())
    quoted = re.compile(rf"""(["'])({names}|podman)\1""")
    found = [f"{path.name}:{number}: {line.strip()}" for path in sorted(SOURCE.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if quoted.search(line)]
    assert not found
