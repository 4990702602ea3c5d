"""From a task to a running machine: its image built once, a bounded number alive, starts rate-limited.

One :class:`Provisioner` per event loop and setting (the env runs every machine on the shared
sandbox loop) holds the slots of live machines, the start rate limit and the image builds: each
task image is built at most once per process (a failed build fails every episode of that task
fast, with the same message and the path of its build log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.container_engine import ContainerEngine
from skyrl_sandbox.errors import SandboxError
from skyrl_sandbox.machine import Machine, MachineSpec
from skyrl_sandbox.machine_factory import start_machine
from skyrl_sandbox.registry import get_backend, registered

from . import substitutes
from .builds import TaskEnvironmentError, build_task_image, substituted, task_image_tag
from .config import HarborTerminalConfig
from .dockerfile import BwrapRecipe, CopyStep, parse_dockerfile, plan_for_bwrap
from .images import TERMINAL_IMAGE
from .services import service_images, with_services
from .task import HarborTask

log = logging.getLogger(__name__)

DEFAULT_WORKDIR = "/app"
_SYSTEM_FOLDERS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys",
                   "/usr", "/var"}


@dataclass
class Started:
    """A started machine and what it took to get it."""

    machine: Machine
    build_s: float
    start_s: float
    wait_s: float
    warnings: list[str] = field(default_factory=list)


class Provisioner:
    def __init__(self, max_live: int, starts_per_second: float) -> None:
        self.slots = asyncio.Semaphore(max_live)
        self.interval = 1.0 / starts_per_second
        self._next_start = 0.0
        self._rate_lock = asyncio.Lock()
        self._builds: dict[tuple[ContainerEngine, str], asyncio.Future[str]] = {}

    async def start(self, task: HarborTask, config: HarborTerminalConfig, backend: str) -> Started:
        """A machine for ``task`` (a live-machine slot is held until :meth:`release`)."""
        waited = time.monotonic()
        await self.slots.acquire()
        try:
            wait_s = time.monotonic() - waited
            built = time.monotonic()
            engine = machine_engine(backend)
            image = None
            if engine is not None:
                image = await self.image(task, config, engine)
                await service_images(self.build_once, engine, task, config)  # the compose services' images too
            build_s = time.monotonic() - built
            await self._rate_limit()
            started = time.monotonic()
            machine = await self._start(task, config, backend, engine, image)
            return Started(machine, build_s, time.monotonic() - started, wait_s, list(machine.warnings))
        except BaseException:
            self.slots.release()
            raise

    def release(self) -> None:
        self.slots.release()

    async def image(self, task: HarborTask, config: HarborTerminalConfig, engine: ContainerEngine) -> str:
        """The task's image tag on ``engine``, built (once per process) from its Dockerfile, or its prebuilt image."""
        environment = task.environment
        if environment.docker_image and environment.context_dir is None:
            return await asyncio.to_thread(_prebuilt_image, task, config, engine)
        assert environment.context_dir is not None
        tag = task_image_tag(task)
        return await self.build_once(engine, tag, partial(
            build_task_image, engine, f"task {task.name}: its image", environment.context_dir,
            environment.dockerfile, tag, config, timeout_s=environment.build_timeout_sec))

    def build_once(self, engine: ContainerEngine, tag: str, build: Callable[[], Coroutine[Any, Any, str]]
                   ) -> Awaitable[str]:
        """``build()``'s result for ``tag`` on ``engine``, started at most once per process (a failure fails every
        later wait)."""
        key = (engine, tag)
        if key not in self._builds:
            self._builds[key] = asyncio.ensure_future(build())
        return asyncio.shield(self._builds[key])

    async def _rate_limit(self) -> None:
        async with self._rate_lock:
            now = time.monotonic()
            if now < self._next_start:
                await asyncio.sleep(self._next_start - now)
            self._next_start = max(now, self._next_start) + self.interval

    async def _start(self, task: HarborTask, config: HarborTerminalConfig, backend: str,
                     engine: ContainerEngine | None, image: str | None) -> Machine:
        environment = task.environment
        recipe = bwrap_recipe(task, backend) if engine is None else None
        workdir = environment.workdir or (recipe.workdir if recipe else await image_workdir(engine, image))
        if workdir in _SYSTEM_FOLDERS or not workdir.startswith("/"):
            workdir = DEFAULT_WORKDIR
        agent_user = task.steps[0].agent_user or config.agent_user
        spec = MachineSpec(
            image=image, workdir=workdir, agent_user=agent_user, cpus=min(environment.cpus, config.max_cpus),
            memory_mb=min(environment.memory_mb, config.max_memory_mb),
            storage_mb=min(environment.storage_mb, config.max_storage_mb), max_processes=config.max_processes,
            network=environment.allow_internet and config.allow_internet,
            env={**(recipe.env if recipe else {}), **environment.env})  # [environment] env wins, as docker run -e does
        if engine is not None:
            spec = with_services(spec, task, await service_images(self.build_once, engine, task, config))
        machine = await start_machine(spec, backend)
        if recipe is not None:
            try:
                await _apply_recipe(machine, task, recipe)
            except BaseException:
                await machine.close()
                raise
        return machine


def machine_engine(backend: str) -> ContainerEngine | None:
    """The container engine whose images ``backend``'s machines run; None for a backend that runs the host's tools
    (the task's Dockerfile is then replayed on them, :func:`bwrap_recipe`)."""
    return get_backend(backend).engine


def image_backends() -> tuple[str, ...]:
    """The installed backends whose machines are containers of an image, in ``auto`` order."""
    return tuple(name for name, backend in registered().items() if backend.runs_images and backend.has_machines)


def container_runtime() -> str:
    """What a task that needs its image built and run needs, in words: a backend that runs images."""
    return f"a container runtime ({' or '.join(image_backends()) or 'none is installed'})"


def _prebuilt_image(task: HarborTask, config: HarborTerminalConfig, engine: ContainerEngine) -> str:
    """The task's ``docker_image`` when ``engine`` has it, else its substitute (built once), else an error."""
    image = task.environment.docker_image
    assert image is not None
    if substitutes.on_engine(engine, image):
        return image
    problem = (f"task {task.name}: its image {image} is not on this {engine.title}, and nothing is pulled; "
               f"load it (docker load / docker build -t {image} ...) first")
    try:
        substitute = substitutes.substitute_for(image)
    except substitutes.UnavailableImage as exc:
        raise TaskEnvironmentError(f"{problem} ({exc})") from None
    if not substitutes.substitutes_enabled(config.substitute_images):
        raise TaskEnvironmentError(f"{problem}, or let the offline base-image map build it from Debian "
                                   f"{substitute.suite} packages (env.substitute_images=true)")
    for warning in substitute.warnings:
        log.warning("task %s: %s", task.name, warning)
    log.info("task %s: %s is not on this engine; using its substitute %s", task.name, image, substitute.tag)
    try:
        return images.ensure_base_image(engine, substitute.declare(), progress=lambda line: log.debug("%s", line))
    except SandboxError as exc:
        raise TaskEnvironmentError(f"task {task.name}: the substitute of its image {image} did not build ({exc})") \
            from exc


def image_source(task: HarborTask) -> str:
    """Where the task's machine comes from, in words: the images its Dockerfile starts from (and what stood in
    for them, once built), or its prebuilt image; and its compose services."""
    environment = task.environment
    if environment.context_dir is None:
        source = f"prebuilt {environment.docker_image}"
    else:
        text = (environment.context_dir / environment.dockerfile).read_text(errors="replace")
        uses = list(dict.fromkeys(use.ref for use in substitutes.image_uses(text)))
        stood_in = substituted(task_image_tag(task))
        source = "FROM " + (", ".join(uses) or "nothing") + (f" ({'; '.join(stood_in)})" if stood_in else "")
    if environment.compose is not None:
        source += f" + services {', '.join(environment.compose.service_names)}"
    return source


def bwrap_recipe(task: HarborTask, backend: str) -> BwrapRecipe:
    """How to recreate the task's image on the host's tools (``backend``, one that runs no images);
    TaskEnvironmentError when that is not possible."""
    environment = task.environment
    needs = f"task {task.name} needs {container_runtime()}"
    if environment.compose is not None:
        raise TaskEnvironmentError(
            f"{needs}: its environment/{environment.compose.path.name} runs services "
            f"({', '.join(environment.compose.service_names) or 'settings for main'}) beside the agent's machine, "
            "which only a container runtime provides")
    if not environment.base_packages_only:
        raise TaskEnvironmentError(
            f"{needs}: it does not declare [metadata.skyrl] base_packages_only = true, so the {backend} backend (the "
            "host's own tools) cannot stand in for its image")
    if environment.tests_run_agent_code:
        raise TaskEnvironmentError(
            f"{needs}: its tests run the agent's code ([metadata.skyrl] tests_run_agent_code), and in a {backend} "
            "machine the agent and the tests share one host user, so that code could write the reward")
    if task.separate_tests:
        raise TaskEnvironmentError(f"{needs}: its tests run in a machine of their own "
                                   "([verifier] environment_mode = \"separate\"), which only a container runtime "
                                   "provides")
    if environment.context_dir is None:
        raise TaskEnvironmentError(f"{needs}: it names a prebuilt image")
    recipe_file = environment.context_dir / environment.dockerfile
    try:
        instructions = parse_dockerfile(recipe_file.read_text(), source=str(recipe_file))
        return plan_for_bwrap(instructions, TERMINAL_IMAGE, source=str(recipe_file))
    except ValueError as exc:
        raise TaskEnvironmentError(f"task {task.name} cannot run on {backend}: {exc}") from exc


async def _apply_recipe(machine: Machine, task: HarborTask, recipe: BwrapRecipe) -> None:
    assert task.environment.context_dir is not None
    context = task.environment.context_dir
    for step in recipe.steps:
        if isinstance(step, CopyStep):
            for dest, files in _copy_sources(context, step).items():
                await machine.put_files(dest, files)
            if step.chmod:
                await machine.exec(["chmod", "-R", step.chmod, step.dest], cwd="/")
            continue
        result = await machine.exec(["mkdir", "-p", step.workdir], cwd="/")
        result = await machine.exec(["/bin/sh", "-c", step.command], env=step.env, cwd=step.workdir,
                                    timeout_s=task.environment.build_timeout_sec)
        if not result.ok:
            raise TaskEnvironmentError(
                f"task {task.name}: RUN {step.command!r} failed on {machine.backend} (exit {result.exit_code}): "
                f"{(result.stderr or result.stdout).decode(errors='replace')[-1000:]}")


def _copy_sources(context: Path, step: CopyStep) -> dict[str, dict[str, bytes]]:
    """destination folder -> files, for one COPY (a folder's contents, a file, or a glob)."""
    sources = sorted(context.glob(step.src)) if any(c in step.src for c in "*?[") else [context / step.src]
    if not sources or not all(path.exists() for path in sources):
        raise TaskEnvironmentError(f"COPY {step.src}: no such file in {context}")
    out: dict[str, dict[str, bytes]] = {}
    for source in sources:
        if source.is_dir():
            folder = step.dest.rstrip("/") or "/"
            files = out.setdefault(folder, {})
            for path in sorted(source.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    files[path.relative_to(source).as_posix()] = path.read_bytes()
        elif step.dest.endswith("/") or len(sources) > 1:
            out.setdefault(step.dest.rstrip("/") or "/", {})[source.name] = source.read_bytes()
        else:
            folder, name = step.dest.rsplit("/", 1)
            out.setdefault(folder or "/", {})[name] = source.read_bytes()
    return out


async def image_workdir(engine: ContainerEngine | None, image: str | None) -> str:
    """The WORKDIR of ``image`` on ``engine``, else /app."""
    if engine is None or image is None:
        return DEFAULT_WORKDIR
    config = await asyncio.to_thread(lambda: engine.shared_client().api.inspect_image(image)["Config"])
    return (config or {}).get("WorkingDir") or DEFAULT_WORKDIR


_provisioners: dict[tuple[int, int, float], Provisioner] = {}


def provisioner(config: HarborTerminalConfig) -> Provisioner:
    """The provisioner of the running loop for these settings."""
    key = (id(asyncio.get_running_loop()), config.max_live_machines, config.starts_per_second)
    if key not in _provisioners:
        _provisioners[key] = Provisioner(config.max_live_machines, config.starts_per_second)
    return _provisioners[key]
