"""A step's tests in a machine of their own (``[verifier] environment_mode = "separate"``), as Harbor runs them.

After the agent's work on the step, its collect commands run and its artifacts are copied out of the
agent's machine (:mod:`.artifacts`; in separate mode they include ``/logs/artifacts``, the folder the
agent may publish into). Then a new machine of the agent's backend (one that runs images) starts from the
tests image (built from ``steps/<name>/tests/Dockerfile`` or ``tests/Dockerfile``, the same way as task images,
when the episode starts; else the task's own image, freshly), the collected files are written into it, root's
and plain data, at the paths they came from, and :func:`~skyrl_harbor_terminal.verifier.verify` runs the tests there. The
reward is read from that machine only, which is removed afterwards: nothing the agent did reaches the tests
but those files. The tests machine runs beside the agent's within the episode's live-machine slot.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from skyrl_sandbox.container_engine import ContainerEngine
from skyrl_sandbox.machine import Machine, MachineSpec
from skyrl_sandbox.machine_factory import start_machine

from .artifacts import ArtifactLog
from .builds import TaskEnvironmentError, build_task_image, task_image_tag
from .config import HarborTerminalConfig
from .provision import Provisioner, container_runtime, image_workdir, machine_engine
from .task_model import Artifact, HarborTask, Step
from .verifier import Verdict, verify

# Harbor's convention: what the agent leaves here is collected (and, in separate mode, handed to the tests).
AGENT_ARTIFACTS = Artifact("/logs/artifacts", "logs/artifacts")


async def prepare_agent_machine(machine: Machine, task: HarborTask) -> None:
    """Give the agent ``/logs/artifacts`` (its own) when some step's tests run apart."""
    if task.separate_tests:
        await machine.put_files(AGENT_ARTIFACTS.source, {}, owner=machine.spec.agent_user)


async def build_tests_images(provisioner: Provisioner, task: HarborTask, config: HarborTerminalConfig,
                             backend: str) -> None:
    """Every step's tests image on the engine of ``backend`` (the agent's), built now (once per process) so a broken
    one fails the episode before it starts."""
    for step in task.steps:
        if step.tests_machine is not None:
            await tests_image(provisioner, task, step, config, engine_for_tests(task, backend))


def engine_for_tests(task: HarborTask, backend: str) -> ContainerEngine:
    """The engine of ``backend`` (the agent's), which builds and runs the tests images; TaskEnvironmentError when
    ``backend`` runs no images."""
    engine = machine_engine(backend)
    if engine is None:
        raise TaskEnvironmentError(f"task {task.name} needs {container_runtime()}: its tests run in a machine of "
                                   f"their own, from an image, and the {backend} backend runs none")
    return engine


async def tests_image(provisioner: Provisioner, task: HarborTask, step: Step, config: HarborTerminalConfig,
                      engine: ContainerEngine) -> str:
    """The tag of ``step``'s tests image on ``engine``: built from its Dockerfile, else the task's own image."""
    assert step.tests_machine is not None
    context = step.tests_machine.context_dir
    if context is None:
        return await provisioner.image(task, config, engine)
    repository = task_image_tag(task).split(":")[0]
    tag = f"{repository}-tests:{hashlib.sha256(str(context.resolve()).encode()).hexdigest()[:10]}"
    folder = context.relative_to(task.path).as_posix()
    return await provisioner.build_once(engine, tag, partial(
        build_task_image, engine, f"task {task.name}: its tests image ({folder}/Dockerfile)", context, "Dockerfile",
        tag, config, timeout_s=task.environment.build_timeout_sec))


async def verify_apart(provisioner: Provisioner, task: HarborTask, step: Step, config: HarborTerminalConfig,
                       backend: str, collected: ArtifactLog | None, timeout_s: float,
                       weights: Mapping[str, float] | None = None) -> Verdict:
    """Run ``step``'s tests in a new machine of ``backend`` (the agent's), of its tests image, holding what
    ``collected`` took for this step."""
    assert step.tests_machine is not None
    engine = engine_for_tests(task, backend)
    image = await tests_image(provisioner, task, step, config, engine)
    environment = task.environment
    spec = MachineSpec(
        image=image, workdir=environment.workdir or await image_workdir(engine, image), agent_user="root",
        cpus=min(environment.cpus, config.max_cpus), memory_mb=min(environment.memory_mb, config.max_memory_mb),
        storage_mb=min(environment.storage_mb, config.max_storage_mb), max_processes=config.max_processes,
        network=step.tests_machine.allow_internet and config.allow_internet, env=environment.env, hostname="tests")
    async with await start_machine(spec, backend) as machine:
        for source, files in _collected_files(collected, step.name):
            await machine.put_files(source, files)
        cwd = machine.spec.workdir if config.verifier_cwd == "workdir" else config.verifier_cwd
        return await verify(machine, task, step, timeout_s, cwd=cwd, weights=weights)


def _collected_files(collected: ArtifactLog | None, step: str) -> list[tuple[str, dict[str, bytes]]]:
    """(folder in the tests machine, relative path -> bytes) for each artifact collected on ``step``."""
    found: list[tuple[str, dict[str, bytes]]] = []
    for entry in collected.collected if collected else []:
        if entry["step"] != step:
            continue
        host, source = Path(entry["path"]), entry["source"]
        if host.is_symlink():
            continue
        if host.is_dir():
            found.append((source, _regular_files(host)))
        elif host.is_file():
            found.append((posixpath.dirname(source) or "/", {posixpath.basename(source): host.read_bytes()}))
    return found


def _regular_files(root: Path) -> dict[str, bytes]:
    """The regular files under ``root`` (written there by :mod:`.artifacts`: no links), by relative path."""
    files: dict[str, bytes] = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files
