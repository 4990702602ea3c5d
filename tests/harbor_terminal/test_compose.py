"""Multi-container tasks: environment/docker-compose.yaml read at load, its services run beside the agent's machine.

The task tests/harbor_terminal/tasks/compose-api has a sidecar API server (built from its own folder,
with a healthcheck) that the agent and the tests reach by service name: its oracle scores 1 on
docker and doing nothing scores 0. Compose features outside the supported subset fail the load,
naming the file, the service and the key; compose tasks never run on bwrap; no container of an
episode outlives it, even one whose start failed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import TERMINAL_IMAGE, bash, play, write_task
from skyrl_harbor_terminal import env as env_module
from skyrl_harbor_terminal.env import HarborTerminalEnv, resolve_backend
from skyrl_harbor_terminal.provision import TaskEnvironmentError, bwrap_recipe
from skyrl_harbor_terminal.task import TaskFormatError, load_task
from skyrl_sandbox.backends.docker.client import DOCKER
from skyrl_sandbox.backends.docker.worker import owner_labels
from skyrl_sandbox.testing import NO_ROUTE_PROBE

COMPOSE_API = Path(__file__).parent / "tasks" / "compose-api"
ROW = {"task_path": str(COMPOSE_API), "name": "test/compose-api", "steps": 1}
# A sidecar from the terminal image itself: nothing to build, so these tasks start fast.
SIDECAR = f"""
services:
  api:
    image: {TERMINAL_IMAGE}
    command: ["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"]
"""
CONNECT_OUT = f"python3 - <<'EOF'\n{NO_ROUTE_PROBE}EOF"
FETCH = "python3 -c \"import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\""


def compose_task(root: Path, compose: str, **files: str) -> dict[str, Any]:
    return write_task(root, {"tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
                             "environment/docker-compose.yaml": compose, **files})


def our_containers() -> list[dict[str, Any]]:
    """Sandbox containers (machines and sidecars) of this test process, running or not."""
    labels = [f"{key}={value}" for key, value in owner_labels().items()]
    return DOCKER.shared_client().api.containers(all=True, filters={"label": labels})


@pytest.fixture
def new_containers() -> Callable[[], list[str]]:
    """Sandbox containers of this process created since the test started (other tests' warm workers live here)."""
    before = {container["Id"] for container in our_containers()}
    return lambda: [container["Id"] for container in our_containers() if container["Id"] not in before]


def text(result: Any) -> str:
    return "\n".join(message["content"] for message in result.observation)


# -- reading the compose file ------------------------------------------------------------------------


def test_the_compose_file_is_read_at_load_with_what_it_adds_to_main() -> None:
    compose = load_task(COMPOSE_API).environment.compose
    assert compose is not None and compose.path.name == "docker-compose.yaml"
    assert compose.main.environment == {"API_URL": "http://api-server:8000"}
    assert compose.main.depends_on == {"api-server": "service_healthy"}
    (api,) = compose.services
    assert api.name == "api-server" and api.user == "nobody"
    assert api.build is not None and api.build.context == (COMPOSE_API / "environment" / "api").resolve()
    assert api.build.dockerfile == "Dockerfile" and api.build.args == {"GREETING": "ready"}
    assert api.environment == {"SECRET_WORD": "tangerine"}  # ${SECRET_WORD:-tangerine}: the default, never the host's
    check = api.healthcheck
    assert check is not None and check.test == ("CMD", "python3", "/srv/health.py")
    assert (check.interval_s, check.timeout_s, check.retries) == (0.25, 5.0, 40)


def test_the_forms_compose_allows_are_read(tmp_path: Path) -> None:
    compose_task(tmp_path, f"""
version: "3.8"
name: forms
x-common: &common
  image: {TERMINAL_IMAGE}
services:
  db:
    <<: *common
    command: sleep infinity
    environment: ["A=1", "B=x=y", "EMPTY="]
    healthcheck:
      test: pg_isready || exit 1
      interval: 1m30s
      start_period: 1h2m3s250ms
  cache:
    <<: *common
    entrypoint: ["/bin/sh", "-c"]
    command: ["echo $$HOME"]
    environment: {{PORT: 6379, DEBUG: true}}
    healthcheck: {{disable: true}}
    working_dir: /srv
    user: "1000"
    depends_on: [db]
  web:
    <<: *common
    build: {{context: ., dockerfile: Dockerfile}}
    depends_on:
      db: {{condition: service_healthy}}
      cache: {{condition: service_started, required: true, restart: true}}
    x-note: ignored, as compose does
""")
    compose = load_task(tmp_path).environment.compose
    assert compose is not None and compose.service_names == ("db", "cache", "web")  # each after what it depends on
    db, cache, web = compose.services
    assert db.command == ("sleep", "infinity") and db.environment == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert db.healthcheck is not None and db.healthcheck.test == ("CMD-SHELL", "pg_isready || exit 1")
    assert db.healthcheck.interval_s == 90 and db.healthcheck.start_period_s == 3723.25
    assert cache.entrypoint == ("/bin/sh", "-c") and cache.command == ("echo $HOME",)
    assert cache.environment == {"PORT": "6379", "DEBUG": "true"} and cache.user == "1000"
    assert cache.healthcheck is not None and cache.healthcheck.disabled and cache.working_dir == "/srv"
    assert web.build is not None and web.build.context == (tmp_path / "environment").resolve()
    assert web.depends_on == {"db": "service_healthy", "cache": "service_started"}


@pytest.mark.parametrize(("service", "where", "words"), [
    ("ports: ['8000:8000']", "services.api.ports", "reach each other by name"),
    ("volumes: ['./data:/data']", "services.api.volumes", "no volumes or bind mounts"),
    ("networks: [backend]", "services.api.networks", "loopback only"),
    ("network_mode: host", "services.api.network_mode", "loopback only"),
    ("privileged: true", "services.api.privileged", "unprivileged"),
    ("cap_add: [NET_ADMIN]", "services.api.cap_add", "unprivileged"),
    ("restart: always", "services.api.restart", "never restarted"),
    ("deploy: {resources: {limits: {memory: 1g}}}", "services.api.deploy", "[environment] cpus and memory"),
    ("frobnicate: 1", "services.api.frobnicate", "supported keys are"),
    ("healthcheck: {test: 'true', interval: 5}", "services.api.healthcheck.interval", "a duration such as"),
    ("healthcheck: {test: 'true', start_interval: 1s}", "services.api.healthcheck.start_interval",
     "newer Docker Engine"),
    ("healthcheck: {test: [curl, localhost]}", "services.api.healthcheck.test", "[CMD, program, args...]"),
    ("environment: {TOKEN: $TOKEN}", "services.api.environment.TOKEN", "${TOKEN} is not filled in"),
    ("environment: [TOKEN]", "services.api.environment.TOKEN", "has no value"),
    ("depends_on: [db]", "services.api.depends_on", "names 'db', which is not a service"),
    ("depends_on: {main: {condition: service_healthy}}", "services.api.depends_on.main", "never healthy"),
    ("build: ../..", "services.api.build.context", "leads out of the task folder"),
])
def test_an_unsupported_compose_feature_fails_the_load_naming_file_service_and_key(
        tmp_path: Path, service: str, where: str, words: str) -> None:
    compose_task(tmp_path, SIDECAR + f"    {service}\n")
    with pytest.raises(TaskFormatError) as raised:
        load_task(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'environment' / 'docker-compose.yaml'}: {where}"), message
    assert words in message


@pytest.mark.parametrize(("compose", "words"), [
    (SIDECAR + "networks: {backend: {}}\n", "top-level key 'networks' is not supported"),
    (SIDECAR + "volumes: {data: {}}\n", "top-level key 'volumes' is not supported"),
    ("services: {}\n", "services: must map service names"),
    ("services: [api]\n", "services: must map service names"),
    ("services:\n  API: {image: x}\n", "services.API: a service name must be a host name"),
    ("services:\n  api: {command: sleep}\n", "services.api: needs a build"),
    ("services:\n  main: {command: sleep 1}\n", "services.main.command is not supported: the agent's machine runs"),
    ("services:\n  main: {user: root}\n", "services.main.user is not supported: set the agent's user"),
    ("services:\n  main: {build: ..}\n", "services.main.build.context: '..' leads out of environment/"),
    ("services:\n  main: {depends_on: [nope]}\n", "services.main.depends_on: names 'nope'"),
    ("services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [a]}\n", "cycle: a -> b -> a"),
    ("services: [\n", "not valid YAML"),
])
def test_a_compose_file_outside_the_subset_fails_the_load(tmp_path: Path, compose: str, words: str) -> None:
    compose_task(tmp_path, compose)
    with pytest.raises(TaskFormatError) as raised:
        load_task(tmp_path)
    assert str(raised.value).startswith(str(tmp_path / "environment" / "docker-compose.")), raised.value
    assert words in str(raised.value)


def test_both_compose_file_names_at_once_are_refused(tmp_path: Path) -> None:
    compose_task(tmp_path, SIDECAR, **{"environment/docker-compose.yml": SIDECAR})
    with pytest.raises(TaskFormatError, match="both docker-compose.yaml and docker-compose.yml exist"):
        load_task(tmp_path)


def test_main_may_name_its_image_in_place_of_the_dockerfile(tmp_path: Path) -> None:
    compose_task(tmp_path, f"services:\n  main: {{image: {TERMINAL_IMAGE}}}\n")
    environment = load_task(tmp_path).environment
    assert environment.context_dir is None and environment.docker_image == TERMINAL_IMAGE
    (tmp_path / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    build: {context: ., dockerfile: main.Dockerfile}\n")
    (tmp_path / "environment" / "main.Dockerfile").write_text(f"FROM {TERMINAL_IMAGE}\n")
    environment = load_task(tmp_path).environment
    assert environment.context_dir == (tmp_path / "environment").resolve()
    assert environment.dockerfile == "main.Dockerfile"


# -- compose tasks need docker -------------------------------------------------------------------------


def test_compose_tasks_never_run_on_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = compose_task(tmp_path, SIDECAR)  # write_task declares base_packages_only = true
    task = load_task(tmp_path)
    assert task.environment.base_packages_only
    with pytest.raises(TaskEnvironmentError, match=r"needs a container runtime \(docker\b.*\): its "
                                                   r"environment/docker-compose.yaml runs services \(api\)"):
        bwrap_recipe(task, "bwrap")
    monkeypatch.setattr(env_module, "_image_problem", lambda backend: "no Docker Engine answers")
    with pytest.raises(TaskEnvironmentError, match=r"needs a container runtime \(docker\b.*\) \(its docker-compose"
                                                   r".yaml runs services.*docker: no Docker Engine answers"):
        resolve_backend("auto", task)  # never bwrap, though the task declares base_packages_only
    monkeypatch.setattr(env_module, "_image_problem", lambda backend: None)
    assert resolve_backend("auto", task) == "docker"
    results, _ = play(row, [bash("true", done=True)], backend="bwrap")
    assert "its environment/docker-compose.yaml runs services" in results[-1].info["error"]


# -- on docker ---------------------------------------------------------------------------------------------


@pytest.mark.docker
def test_the_oracle_scores_1_and_doing_nothing_scores_0_with_a_sidecar_api(docker_backend: str,
                                                                          new_containers: Any) -> None:
    env = HarborTerminalEnv(task=ROW, config={"backend": docker_backend})
    try:
        env.reset(options={"task": ROW})
        (gold,) = env.gold_actions() or []
        oracle = env.step(gold)
    finally:
        env.close()
    assert oracle.reward == 1.0, oracle.info
    assert "written='tangerine' posted='eniregnat' ok=True" in oracle.info["verifier_output_tail"]
    assert new_containers() == []
    nothing, _ = play(ROW, [bash("true", done=True)], backend=docker_backend)
    assert nothing[-1].reward == 0.0 and "ok=False" in nothing[-1].info["verifier_output_tail"]
    assert new_containers() == []


@pytest.mark.docker
def test_the_agent_reaches_the_sidecar_by_name_and_nothing_off_the_box(docker_backend: str,
                                                                         new_containers: Any) -> None:
    results, _ = play(ROW, [bash(
        f"{FETCH} http://api-server:8000/greeting; {FETCH} http://localhost:8000/health",
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://api-server:8000/greeting').read().decode())\"",
        'echo "API_URL=$API_URL"; tail -n +2 /proc/net/route | wc -l; tail -n +3 /proc/net/dev | cut -d: -f1',
        CONNECT_OUT, done=True)], backend=docker_backend)
    output = text(results[0])
    assert output.count("200\n") == 2 and "\nready\n" in output  # the build arg reached the service's image
    assert "API_URL=http://api-server:8000\n0\n    lo\n" in output  # main's compose environment; no route; only lo
    assert "1.1.1.1 ENETUNREACH\n10.0.0.1 ENETUNREACH\n172.17.0.1 ENETUNREACH" in output
    assert new_containers() == []


@pytest.mark.docker
@pytest.mark.parametrize(("service", "words"), [
    ("    healthcheck: {test: 'echo not listening yet; exit 1', interval: 200ms, retries: 2}\n",
     ["sidecar api is unhealthy", "not listening yet"]),
    ("    entrypoint: [sh, -c, 'echo no config file >&2; exit 2']\n",
     ["sidecar api exited with status 2", "no config file"]),
])
def test_a_sidecar_that_fails_ends_the_episode_with_an_error_and_leaves_no_container(
        tmp_path: Path, docker_backend: str, service: str, words: list[str], new_containers: Any) -> None:
    row = compose_task(tmp_path, SIDECAR + service)
    results, env = play(row, [bash("true", done=True)], backend=docker_backend)
    error = results[-1].info["error"]
    for text_ in words:
        assert text_ in error, error
    assert env.get_metrics()["container_errors"] == 1.0
    assert new_containers() == []


@pytest.mark.docker
def test_a_service_image_that_is_not_on_the_engine_is_named(tmp_path: Path, docker_backend: str,
                                                            new_containers: Any) -> None:
    row = compose_task(tmp_path, "services:\n  db: {image: 'skyrl-test/no-such-image:1'}\n")
    results, _ = play(row, [bash("true", done=True)], backend=docker_backend)
    assert "the image skyrl-test/no-such-image:1 of its service db is not on this Docker Engine, and nothing is " \
           "pulled" in results[-1].info["error"]
    assert new_containers() == []
