"""Offline base images: public FROM images built here from Debian packages, FROM lines rewritten at build time.

The map itself (every reference form, digests, prefixes, unknown images, version warnings), the
Dockerfile reading and rewriting, and the build plan run without Docker. On docker, one substitute
(``python:3.11-slim-bookworm``, about 30 s to build once per engine, shared by the module) behaves
like the official image, the task tests/harbor_terminal/tasks/python-substitute built through it
scores 1 with its oracle and 0 doing nothing, an offline RUN step that needs the network says why,
``build_network`` gives RUN steps the host's network, and ``skyrl harbor images`` lists it all.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import bash, play, write_task
from skyrl_harbor_terminal import substitutes
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.env import BUILTIN_TASKS, HarborTerminalEnv
from skyrl_harbor_terminal.substitutes import (
    UnavailableImage,
    image_uses,
    offline_build_hint,
    plan_build,
    rewrite,
    substitute_for,
)
from skyrl_sandbox.testing import require_backend

TASK = Path(__file__).parent / "tasks" / "python-substitute"
ROW = {"task_path": str(TASK), "name": "test/python-substitute", "steps": 1}
PYTHON_311 = f"skyrl-substitute/python:3.11-slim-bookworm-{substitutes.VERSION}"
SKYRL = Path(sys.executable).parent / "skyrl"
DIGEST = "sha256:" + "0123456789abcdef" * 4
BUILTIN_COUNT = sum(1 for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())


def everywhere(suite: str) -> bool:
    return True


# -- the map ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "suite"), [
    ("debian:bookworm", "bookworm"), ("debian:bookworm-slim", "bookworm"), ("debian:12", "bookworm"),
    ("debian:12-slim", "bookworm"), ("debian:12.5", "bookworm"), ("debian:bookworm-20240513-slim", "bookworm"),
    ("debian:bullseye-slim", "bullseye"), ("debian:11", "bullseye"), ("debian:trixie", "trixie"),
    ("debian:13-slim", "trixie"), ("debian:stable-slim", "trixie"), ("debian", "trixie"),
    ("debian:oldstable", "bookworm"),
])
def test_debian_tags_map_to_their_suite(ref: str, suite: str) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert (substitute.suite, substitute.stands_for) == (suite, f"debian:{suite}-slim")
    assert substitute.tag == f"skyrl-substitute/debian:{suite}-slim-{substitutes.VERSION}"
    assert substitute.warnings == () and "python3" in substitute.packages


@pytest.mark.parametrize(("ref", "suite", "python"), [
    ("python:3.11-slim-bookworm", "bookworm", "3.11"), ("python:3.11-slim", "bookworm", "3.11"),
    ("python:3.11", "bookworm", "3.11"), ("python:3.11-bookworm", "bookworm", "3.11"),
    ("python:3.11.9-slim-bookworm", "bookworm", "3.11"), ("python:3.9-slim-bullseye", "bullseye", "3.9"),
    ("python:3.9", "bullseye", "3.9"), ("python:3.13-slim", "trixie", "3.13"), ("python:3.13-trixie", "trixie", "3.13"),
])
def test_python_versions_map_to_the_suite_with_that_python(ref: str, suite: str, python: str) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert (substitute.suite, substitute.warnings) == (suite, ())
    assert substitute.tag == f"skyrl-substitute/python:{python}-slim-{suite}-{substitutes.VERSION}"
    assert substitute.stands_for == f"python:{python}-slim-{suite}"
    assert {"python3", "python3-pip", "python3-venv", "python-is-python3"} <= set(substitute.packages)
    assert dict(substitute.env) == {"PIP_BREAK_SYSTEM_PACKAGES": "1"} and substitute.cmd == ("python3",)


@pytest.mark.parametrize(("ref", "suite", "asked", "has"), [
    ("python:3.12-slim", "trixie", "3.12", "3.13"),  # nearest, newer on a tie
    ("python:3.10-slim", "bookworm", "3.10", "3.11"),
    ("python:3.8", "bullseye", "3.8", "3.9"),
    ("python:3.14-slim", "trixie", "3.14", "3.13"),
    ("python:3.13-slim-bookworm", "bookworm", "3.13", "3.11"),  # a named suite is always used
    ("python:3.12-bullseye", "bullseye", "3.12", "3.9"),
])
def test_a_python_version_no_suite_has_is_substituted_with_a_warning_naming_both(ref: str, suite: str, asked: str,
                                                                                 has: str) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert substitute.suite == suite
    (warning,) = substitute.warnings
    assert ref in warning and f"Python {asked}" in warning and f"Debian {suite}'s Python {has}" in warning


@pytest.mark.parametrize("ref", ["python:3", "python:3-slim", "python:slim", "python", "python:latest"])
def test_python_without_a_minor_version_gets_the_newest_with_a_warning(ref: str) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert substitute.suite == "trixie"
    (warning,) = substitute.warnings
    assert "names no minor version" in warning and "Python 3.13" in warning


@pytest.mark.parametrize(("ref", "suite"), [
    ("ubuntu:20.04", "bullseye"), ("ubuntu:focal", "bullseye"), ("ubuntu:22.04", "bookworm"),
    ("ubuntu:jammy-20240227", "bookworm"), ("ubuntu:24.04", "trixie"), ("ubuntu:noble", "trixie"),
    ("ubuntu:26.04", "trixie"), ("ubuntu", "trixie"),
])
def test_ubuntu_maps_to_the_nearest_debian_suite_and_says_its_apt_sources_are_debians(ref: str, suite: str) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert substitute.suite == suite and substitute.tag.startswith(f"skyrl-substitute/debian:{suite}-slim-")
    (warning,) = substitute.warnings
    assert f"{ref} is substituted by Debian {suite}, not Ubuntu" in warning and "apt sources are Debian's" in warning


def test_ubuntu_24_04_falls_back_to_bookworm_where_trixie_cannot_be_built() -> None:
    substitute = substitute_for("ubuntu:24.04", buildable=lambda suite: suite != "trixie")
    assert substitute.suite == "bookworm"
    assert "(trixie, the nearest, cannot be built here)" in substitute.warnings[0]
    assert substitute_for("python:3.13-slim", buildable=lambda suite: suite != "trixie").suite == "bookworm"


@pytest.mark.parametrize(("ref", "dropped"), [
    (f"python:3.11-slim-bookworm@{DIGEST}", ["digest sha256:0123456789ab... dropped"]),
    ("docker.io/library/python:3.11-slim-bookworm", ["docker.io/ prefix dropped", "library/ prefix dropped"]),
    ("library/python:3.11-slim-bookworm", ["library/ prefix dropped"]),
    (f"docker.io/python:3.11-slim-bookworm@{DIGEST}", ["digest", "docker.io/ prefix dropped"]),
])
def test_digests_and_docker_hub_prefixes_are_accepted_and_dropped_with_a_note(ref: str, dropped: list[str]) -> None:
    substitute = substitute_for(ref, buildable=everywhere)
    assert substitute.tag == PYTHON_311 and substitute.ref == ref
    assert len(substitute.notes) == len(dropped)
    for note, words in zip(substitute.notes, dropped, strict=True):
        assert note.startswith(ref) and words in note


@pytest.mark.parametrize("ref", [
    "nvidia/cuda:12.2.0-runtime-ubuntu22.04", "ghcr.io/astral-sh/uv:0.5", "alpine:3.19", "localhost:5000/python:3.11",
    "python:3.11-alpine", "python:2.7-slim", "debian:sid", "debian:buster", "ubuntu:latest-ish",
])
def test_images_the_map_cannot_build_raise_naming_the_image_and_the_map(ref: str) -> None:
    with pytest.raises(UnavailableImage) as raised:
        substitute_for(ref, buildable=everywhere)
    message = str(raised.value)
    assert message.startswith(f"{ref} cannot be had here: nothing is pulled")
    assert "offline base-image map" in message and "Offline base images" in message
    assert "load it onto the engine first" in message


# -- Dockerfiles ------------------------------------------------------------------------------------------


MULTI_STAGE = f"""\
# syntax=docker/dockerfile:1
ARG BASE=python:3.12-slim
ARG UNSET
FROM --platform=linux/amd64 ${{BASE}} AS build
RUN python - <<EOF
from pathlib import Path
Path("/x").write_text("FROM ubuntu:24.04")
EOF
RUN echo one \\
    && echo two \\
FROM notanimage:1
COPY --from=ghcr.io/astral-sh/uv:0.5 /uv /bin/uv
FROM debian:bookworm-slim@{DIGEST}
COPY --from=build /x /x
COPY --from=0 /x /y
FROM build
FROM scratch
"""


def test_image_uses_are_each_from_and_copy_from_of_an_image_not_stages_heredocs_or_continuations() -> None:
    uses = [(use.ref, use.line, use.instruction, use.written) for use in image_uses(MULTI_STAGE)]
    assert uses == [
        ("python:3.12-slim", 4, "FROM", "${BASE}"),
        ("ghcr.io/astral-sh/uv:0.5", 12, "COPY --from", "ghcr.io/astral-sh/uv:0.5"),
        (f"debian:bookworm-slim@{DIGEST}", 13, "FROM", f"debian:bookworm-slim@{DIGEST}"),
    ]


def test_rewrite_changes_only_the_image_words_it_is_given() -> None:
    text = rewrite(MULTI_STAGE, {"python:3.12-slim": "local/py:1", f"debian:bookworm-slim@{DIGEST}": "local/deb:1",
                                 "ghcr.io/astral-sh/uv:0.5": "local/uv:1"})
    old, new = MULTI_STAGE.splitlines(), text.splitlines()
    changed = {number + 1: line for number, line in enumerate(new) if line != old[number]}
    assert changed == {4: "FROM --platform=linux/amd64 local/py:1 AS build", 12: "COPY --from=local/uv:1 /uv /bin/uv",
                       13: "FROM local/deb:1"}
    assert text.endswith("FROM scratch\n") and len(new) == len(old)


def write_dockerfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return path


def test_plan_build_substitutes_what_the_engine_lacks_and_logs_each_substitution(tmp_path: Path) -> None:
    text = f"FROM python:3.11-slim-bookworm@{DIGEST}\nWORKDIR /app\nFROM debian:12 AS tools\nFROM local/base:1\n"
    recipe = write_dockerfile(tmp_path, text)
    plan = plan_build(recipe, enabled=True, exists=lambda ref: ref == "local/base:1")
    assert plan.text == (f"FROM {PYTHON_311}\nWORKDIR /app\nFROM skyrl-substitute/debian:bookworm-slim-"
                         f"{substitutes.VERSION} AS tools\nFROM local/base:1\n")
    assert recipe.read_text() == text  # the file on disk is never changed
    assert [s.tag for s in plan.substitutes] == [PYTHON_311, f"skyrl-substitute/debian:bookworm-slim-{substitutes.VERSION}"]
    assert plan.warnings == []
    assert any("digest sha256:0123456789ab... dropped" in note for note in plan.notes)
    assert f"{recipe}:1: FROM python:3.11-slim-bookworm@{DIGEST} -> {PYTHON_311}" in "\n".join(plan.notes)
    assert "Debian bookworm packages; the Dockerfile on disk is unchanged" in plan.notes[1]


def test_plan_build_leaves_images_on_the_engine_and_uses_a_local_tag_for_an_unknown_digest(tmp_path: Path) -> None:
    recipe = write_dockerfile(tmp_path, "FROM python:3.11-slim-bookworm\nRUN true\n")
    assert plan_build(recipe, enabled=True, exists=lambda ref: True).text is None
    recipe = write_dockerfile(tmp_path, f"FROM ubuntu:24.04@{DIGEST}\n")
    plan = plan_build(recipe, enabled=True, exists=lambda ref: ref == "ubuntu:24.04")
    assert plan.text == "FROM ubuntu:24.04\n" and plan.substitutes == []
    assert "using the local ubuntu:24.04 (digest not checked)" in plan.notes[0]


def test_plan_build_warns_about_version_mismatches_in_the_log(tmp_path: Path) -> None:
    recipe = write_dockerfile(tmp_path, "FROM python:3.13-slim-bookworm\n")
    plan = plan_build(recipe, enabled=True, exists=lambda ref: False)
    (warning,) = plan.warnings
    assert "asks for Python 3.13" in warning and "Debian bookworm's Python 3.11" in warning
    assert plan.notes[-1] == f"warning: {warning}"


def test_plan_build_refuses_unavailable_images_and_a_disabled_map_clearly(tmp_path: Path) -> None:
    recipe = write_dockerfile(tmp_path, "FROM debian:12\nCOPY --from=nvidia/cuda:12.2.0-base /x /x\n")
    with pytest.raises(UnavailableImage, match=rf"{recipe}:2: COPY --from nvidia/cuda:12.2.0-base cannot be had here"):
        plan_build(recipe, enabled=True, exists=lambda ref: False)
    recipe = write_dockerfile(tmp_path, "FROM python:3.11-slim\n")
    with pytest.raises(UnavailableImage) as raised:
        plan_build(recipe, enabled=False, exists=lambda ref: False)
    message = str(raised.value)
    assert f"{recipe}:1: FROM python:3.11-slim: the image is not on the engine" in message
    assert "could build it from Debian bookworm packages, but it is off: set env.substitute_images=true" in message


def test_the_settings_default_to_their_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = HarborTerminalConfig()
    assert config.substitute_images is None and config.build_network is None
    monkeypatch.setenv(substitutes.SETTINGS_ENV, str(tmp_path / "no-settings.toml"))
    monkeypatch.delenv(substitutes.SUBSTITUTE_ENV, raising=False)
    monkeypatch.delenv(substitutes.BUILD_NETWORK_ENV, raising=False)
    assert substitutes.substitutes_enabled(None) is True and substitutes.build_network_enabled(None) is False
    monkeypatch.setenv(substitutes.SUBSTITUTE_ENV, "0")
    monkeypatch.setenv(substitutes.BUILD_NETWORK_ENV, "1")
    assert substitutes.substitutes_enabled(None) is False and substitutes.build_network_enabled(None) is True
    assert substitutes.substitutes_enabled(True) is True and substitutes.build_network_enabled(False) is False
    monkeypatch.setenv(substitutes.BUILD_NETWORK_ENV, "maybe")
    with pytest.raises(ValueError, match="SKYRL_BUILD_NETWORK='maybe': expected 1 or 0"):
        substitutes.build_network_enabled(None)


def test_the_machine_settings_file_sets_the_defaults_below_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    settings = tmp_path / "harbor.toml"  # what scripts/setup.sh writes where the package mirrors answer
    settings.write_text("build_network = true\nsubstitute_images = false\n")
    monkeypatch.setenv(substitutes.SETTINGS_ENV, str(settings))
    monkeypatch.delenv(substitutes.SUBSTITUTE_ENV, raising=False)
    monkeypatch.delenv(substitutes.BUILD_NETWORK_ENV, raising=False)
    assert substitutes.build_network_enabled(None) is True and substitutes.substitutes_enabled(None) is False
    monkeypatch.setenv(substitutes.BUILD_NETWORK_ENV, "0")  # the variable wins over the file, the config over both
    assert substitutes.build_network_enabled(None) is False and substitutes.build_network_enabled(True) is True
    settings.write_text('build_network = "yes"\n')
    monkeypatch.delenv(substitutes.BUILD_NETWORK_ENV)
    with pytest.raises(ValueError, match=r"harbor.toml: build_network must be true or false, got 'yes'"):
        substitutes.build_network_enabled(None)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(substitutes.SETTINGS_ENV)
    assert substitutes.settings_file() == tmp_path / "config" / "skyrl" / "harbor.toml"


@pytest.mark.parametrize("output", [
    "W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure resolving "
    "'deb.debian.org'\nE: Unable to locate package curl",
    "ERROR: Could not find a version that satisfies the requirement requests\n"
    "ERROR: No matching distribution found for requests",
    "curl: (6) Could not resolve host: example.com",
])
def test_offline_build_failures_are_explained(output: str) -> None:
    hint = offline_build_hint(f"building x failed: The command '/bin/sh -c ...' returned a non-zero code: 100\n{output}")
    assert hint is not None and "task image builds have none (build_network is off)" in hint
    assert "env.build_network=true (or SKYRL_BUILD_NETWORK=1)" in hint and "Pre-bake" in hint
    assert offline_build_hint("E: Unable to locate package no-such-thing") is None


def test_skyrl_harbor_images_says_when_no_engine_answers(tmp_path: Path) -> None:
    result = skyrl("harbor", "images", str(TASK), "--json",
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert result.returncode == 0, result.stderr
    assert "no Docker Engine answers" in result.stderr
    (row,) = json.loads(result.stdout)["images"]
    assert row["image"] == "python:3.11-slim-bookworm" and row["on_engine"] is None and row["state"] == "substitute"


# -- on docker --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_substitute() -> str:
    """The substitute of python:3.11-slim-bookworm on the engine (built once per engine, ~30 s)."""
    require_backend("docker")
    from skyrl_sandbox.backends.docker import images
    from skyrl_sandbox.backends.docker.client import DOCKER

    tag = substitute_for("python:3.11-slim-bookworm").declare()
    started = time.monotonic()
    images.ensure_base_image(DOCKER, tag, progress=lambda line: None)
    print(f"{tag} ready in {time.monotonic() - started:.1f} s")
    return tag


def inspect(tag: str) -> dict[str, Any]:
    from skyrl_sandbox.backends.docker.client import DOCKER

    return DOCKER.shared_client().api.inspect_image(tag)["Config"]


def run_in(tag: str, script: str) -> str:
    from skyrl_sandbox.backends.docker.client import DOCKER

    client = DOCKER.shared_client()
    return client.containers.run(tag, ["bash", "-c", script], network_mode="none", remove=True,
                                 stderr=True).decode()


@pytest.mark.docker
@pytest.mark.slow
def test_the_substitute_behaves_like_the_official_python_image(python_substitute: str) -> None:
    config = inspect(python_substitute)
    assert config["Labels"][substitutes.LABEL] == "python:3.11-slim-bookworm"
    assert config["Labels"][substitutes.SUITE_LABEL] == "bookworm"
    assert "PIP_BREAK_SYSTEM_PACKAGES=1" in config["Env"] and "LANG=C.UTF-8" in config["Env"]
    assert not config.get("WorkingDir") and config["Cmd"] == ["python3"]
    output = run_in(python_substitute, "for p in python python3 pip pip3; do command -v $p; done; python --version; "
                                       "pip --version; python3 -m venv /tmp/v && /tmp/v/bin/python -V; "
                                       "grep -h '^deb ' /etc/apt/sources.list")
    lines = output.splitlines()
    assert lines[:4] == ["/usr/bin/python", "/usr/bin/python3", "/usr/bin/pip", "/usr/bin/pip3"], output
    assert lines[4].startswith("Python 3.11.") and "(python 3.11)" in lines[5] and lines[6].startswith("Python 3.11.")
    assert "deb http://deb.debian.org/debian bookworm main" in lines[7:] or os.environ.get("SKYRL_DEBIAN_MIRROR")


@pytest.mark.docker
@pytest.mark.slow
def test_a_task_from_a_public_python_image_scores_1_with_its_oracle_and_0_doing_nothing(
        python_substitute: str, tmp_path: Path) -> None:
    task = shutil.copytree(TASK, tmp_path / "python-substitute")  # a folder of its own: built, with a log, each run
    row = {**ROW, "task_path": str(task)}
    dockerfile = (task / "environment" / "Dockerfile").read_text()
    env = HarborTerminalEnv(task=row, config={"backend": "docker", "build_logs": str(tmp_path)})
    try:
        env.reset(options={"task": row})
        (gold,) = env.gold_actions() or []
        oracle = env.step(gold)
    finally:
        env.close()
    assert oracle.reward == 1.0 and oracle.terminated, oracle.info
    assert "PASS" in oracle.info["verifier_output_tail"]
    nothing, _ = play(row, [bash("python --version", done=True)], backend="docker", build_logs=str(tmp_path))
    assert nothing[-1].reward == 0.0 and "Python 3.11." in nothing[-1].observation[-1]["content"]
    assert "FileNotFoundError" in nothing[-1].info["verifier_output_tail"]
    assert (task / "environment" / "Dockerfile").read_text() == dockerfile
    (log,) = tmp_path.glob("*python-substitute*.log")
    text = log.read_text()
    assert f"FROM python:3.11-slim-bookworm -> {python_substitute}" in text.splitlines()[0]
    assert "Step 1/" in text and f"FROM {python_substitute}" in text


@pytest.mark.docker
@pytest.mark.slow
def test_an_offline_run_step_that_needs_the_network_says_why_and_what_to_do(python_substitute: str,
                                                                            tmp_path: Path) -> None:
    row = write_task(tmp_path / "needs-apt", {
        "environment/Dockerfile": "FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y cowsay\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}, base_only=False)
    results, _ = play(row, [bash("true", done=True)], backend="docker", build_network=False)
    error = results[-1].info["error"]
    assert results[-1].truncated and "its image did not build" in error
    assert "a RUN step needed the network ('Temporary failure resolving')" in error
    assert "env.build_network=true (or SKYRL_BUILD_NETWORK=1)" in error and "; build log: " in error
    log = Path(error.rsplit("build log: ", 1)[1].strip())
    assert "hint: a RUN step needed the network" in log.read_text()


@pytest.mark.docker
def test_a_rewritten_dockerfile_builds_from_an_archive_and_keeps_the_digest_cache(docker_backend: str,
                                                                                  tmp_path: Path) -> None:
    from harbor_helpers import TERMINAL_IMAGE
    from skyrl_sandbox.backends.docker import images
    from skyrl_sandbox.backends.docker.client import DOCKER

    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM no-such-image:on-disk\n")
    (context / "data.txt").write_text("data\n")
    (context / "secret.txt").write_text("ignored\n")
    (context / ".dockerignore").write_text("# comment\nsecret.txt\n")
    text = f"FROM {TERMINAL_IMAGE}\nCOPY . /ctx\nRUN ls -A /ctx > /listing\n"
    tag = "skyrl-substitutes-test/rewritten:1"
    messages: list[str] = []
    try:
        images.build_image(DOCKER, context, tag, dockerfile_text=text, force=True, notes=["note: FROM rewritten"],
                           log_file=tmp_path / "build.log", progress=messages.append)
        assert messages[1] == "note: FROM rewritten"
        assert (tmp_path / "build.log").read_text().startswith("note: FROM rewritten\n")
        listing = DOCKER.shared_client().containers.run(tag, ["cat", "/listing"], network_mode="none", remove=True)
        assert listing.decode().split() == [".dockerignore", "Dockerfile", "data.txt"]  # not ours, not ignored ones
        assert (context / "Dockerfile").read_text() == "FROM no-such-image:on-disk\n"
        messages.clear()
        images.build_image(DOCKER, context, tag, dockerfile_text=text, progress=messages.append)
        assert messages == [f"{tag} is up to date with {context}"]
        messages.clear()
        images.build_image(DOCKER, context, tag, dockerfile_text=text + "RUN true\n", progress=messages.append)
        assert messages[-1].startswith(f"built {tag} in ")  # another text is another image
    finally:
        DOCKER.shared_client().api.remove_image(tag, force=True)


@pytest.fixture
def host_listener() -> Iterator[tuple[int, threading.Event]]:
    """A TCP server on the host's loopback; the event is set when something connects."""
    server = socket.create_server(("127.0.0.1", 0))
    reached = threading.Event()

    def accept() -> None:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        reached.set()
        connection.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1], reached
    finally:
        server.close()


@pytest.mark.docker
@pytest.mark.slow
def test_build_network_gives_run_steps_the_hosts_network(python_substitute: str, tmp_path: Path,
                                                         host_listener: tuple[int, threading.Event]) -> None:
    port, reached = host_listener
    connect = f"RUN python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)\"\n"
    files = {"environment/Dockerfile": f"FROM python:3.11-slim-bookworm\n{connect}",
             "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}
    offline, _ = play(write_task(tmp_path / "offline", files, base_only=False), [bash("true", done=True)],
                      backend="docker", build_network=False)
    assert "its image did not build" in offline[-1].info["error"] and not reached.is_set()
    online, _ = play(write_task(tmp_path / "online", files, base_only=False), [bash("true", done=True)],
                     backend="docker", build_network=True)
    assert "error" not in online[-1].info, online[-1].info
    assert online[-1].reward == 1.0 and reached.wait(5)


def skyrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKYRL), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "250", **(env or {})})


@pytest.mark.docker
def test_skyrl_harbor_images_lists_what_each_dataset_needs_and_how_it_is_had(docker_backend: str,
                                                                             tmp_path: Path) -> None:
    builtin = skyrl("harbor", "images")
    assert builtin.returncode == 0, builtin.stderr
    assert f"images needed by {BUILTIN_COUNT} task(s)" in builtin.stdout
    assert "skyrl-terminal-base:bookworm-1" in builtin.stdout and "local base image, Debian bookworm" in builtin.stdout
    dataset = tmp_path / "dataset"
    shutil.copytree(TASK, dataset / "python-substitute")
    test_sh = {"tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}
    write_task(dataset / "cuda", {"environment/Dockerfile": "FROM nvidia/cuda:12.2.0-base-ubuntu22.04\n", **test_sh})
    write_task(dataset / "noble", {"environment/Dockerfile": "FROM ubuntu:24.04\n", **test_sh})
    write_task(dataset / "broken", {"task.toml": "this is not toml"})
    table = skyrl("harbor", "images", str(dataset))
    assert table.returncode == 0, table.stderr
    assert "images needed by 3 task(s)" in table.stdout
    assert f"problem: {dataset / 'broken'}: not loaded (" in table.stdout
    assert f"substitute from Debian bookworm: {PYTHON_311}" in table.stdout
    assert "cannot be had" in table.stdout and "nvidia/cuda:12.2.0-base-ubuntu22.04" in table.stdout
    listed = skyrl("harbor", "images", str(dataset), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["image"]: row for row in json.loads(listed.stdout)["images"]}
    assert set(rows) == {"python:3.11-slim-bookworm", "nvidia/cuda:12.2.0-base-ubuntu22.04", "ubuntu:24.04"}
    python = rows["python:3.11-slim-bookworm"]
    assert python["state"] == "substitute" and python["substitute"] == PYTHON_311 and python["suite"] == "bookworm"
    assert python["tasks"] == ["test/python-substitute"] and python["on_engine"] is False
    assert python["built"] in (True, False) and python["warnings"] == []
    cuda = rows["nvidia/cuda:12.2.0-base-ubuntu22.04"]
    assert cuda["state"] == "cannot be had" and "offline base-image map" in cuda["problem"]
    ubuntu = rows["ubuntu:24.04"]
    assert ubuntu["state"] == "substitute" and "apt sources are Debian's" in ubuntu["warnings"][0]
