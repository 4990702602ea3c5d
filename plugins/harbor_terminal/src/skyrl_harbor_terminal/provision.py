"""From a task to a running machine: its image built once, a bounded number alive, starts rate-limited.

One :class:`Provisioner` per event loop and setting (the env runs every machine on the shared
sandbox loop) holds the slots of live machines, the start rate limit and the image builds: each
task image is built at most once per process (a failed build fails every episode of that task
fast, with the same message and the path of its build log).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from skyrl_sandbox import images
from skyrl_sandbox.errors import SandboxError
from skyrl_sandbox.machine import Machine, MachineSpec, start_machine

from .config import HarborTerminalConfig
from .dockerfile import BwrapRecipe, CopyStep, parse_dockerfile, plan_for_bwrap
from .images import TERMINAL_IMAGE
from .task import HarborTask

log = logging.getLogger(__name__)

DEFAULT_WORKDIR = "/app"
_SYSTEM_FOLDERS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys",
                   "/usr", "/var"}


class TaskEnvironmentError(SandboxError):
    """The task's environment cannot be built or started here; the message names the task."""


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
        self._builds: dict[str, asyncio.Future[str]] = {}

    async def start(self, task: HarborTask, config: HarborTerminalConfig, backend: str) -> Started:
        """A machine for ``task`` (a live-machine slot is held until :meth:`release`)."""
        waited = time.monotonic()
        await self.slots.acquire()
        try:
            wait_s = time.monotonic() - waited
            built = time.monotonic()
            image = await self.image(task, config) if backend == "docker" else None
            build_s = time.monotonic() - built
            await self._rate_limit()
            started = time.monotonic()
            machine = await self._start(task, config, backend, image)
            return Started(machine, build_s, time.monotonic() - started, wait_s, list(machine.warnings))
        except BaseException:
            self.slots.release()
            raise

    def release(self) -> None:
        self.slots.release()

    async def image(self, task: HarborTask, config: HarborTerminalConfig) -> str:
        """The task's image tag, built (once per process) from its Dockerfile, or its prebuilt image."""
        environment = task.environment
        if environment.docker_image and environment.context_dir is None:
            if not await asyncio.to_thread(images.image_exists, environment.docker_image):
                raise TaskEnvironmentError(
                    f"task {task.name}: its image {environment.docker_image} is not on this Docker Engine, and nothing "
                    f"is pulled; load it (docker load / docker build -t {environment.docker_image} ...) first")
            return environment.docker_image
        tag = task_image_tag(task)
        build = self._builds.get(tag)
        if build is None:
            build = asyncio.ensure_future(self._build(task, config, tag))
            self._builds[tag] = build
        return await asyncio.shield(build)

    async def _build(self, task: HarborTask, config: HarborTerminalConfig, tag: str) -> str:
        assert task.environment.context_dir is not None
        logs = Path(config.build_logs or Path.home() / ".cache" / "skyrl" / "harbor" / "build-logs")
        logs.mkdir(parents=True, exist_ok=True)
        log_file = logs / f"{tag.replace('/', '_').replace(':', '_')}.log"
        try:
            return await asyncio.to_thread(
                images.build_image, task.environment.context_dir, tag, dockerfile=task.environment.dockerfile,
                base=TERMINAL_IMAGE, timeout_s=task.environment.build_timeout_sec, log_file=log_file,
                progress=lambda line: log.debug("%s", line))
        except SandboxError as exc:
            raise TaskEnvironmentError(f"task {task.name}: its image did not build ({exc}); build log: {log_file}") \
                from exc

    async def _rate_limit(self) -> None:
        async with self._rate_lock:
            now = time.monotonic()
            if now < self._next_start:
                await asyncio.sleep(self._next_start - now)
            self._next_start = max(now, self._next_start) + self.interval

    async def _start(self, task: HarborTask, config: HarborTerminalConfig, backend: str, image: str | None
                     ) -> Machine:
        environment = task.environment
        recipe = bwrap_recipe(task) if backend == "bwrap" else None
        workdir = environment.workdir or (recipe.workdir if recipe else await _image_workdir(image))
        if workdir in _SYSTEM_FOLDERS or not workdir.startswith("/"):
            workdir = DEFAULT_WORKDIR
        agent_user = task.steps[0].agent_user or config.agent_user
        spec = MachineSpec(
            image=image, workdir=workdir, agent_user=agent_user, cpus=min(environment.cpus, config.max_cpus),
            memory_mb=min(environment.memory_mb, config.max_memory_mb),
            storage_mb=min(environment.storage_mb, config.max_storage_mb), max_processes=config.max_processes,
            network=environment.allow_internet and config.allow_internet, env=recipe.env if recipe else {})
        machine = await start_machine(spec, backend)
        if recipe is not None:
            try:
                await _apply_recipe(machine, task, recipe)
            except BaseException:
                await machine.close()
                raise
        return machine


def task_image_tag(task: HarborTask) -> str:
    """A tag per task folder: its name, made tag-safe, and a hash of where it lives."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip("-.") or "task"
    where = hashlib.sha256(str(task.path.resolve()).encode()).hexdigest()[:10]
    return f"skyrl-harbor/{slug[:80]}:{where}"


def bwrap_recipe(task: HarborTask) -> BwrapRecipe:
    """How to recreate the task's image without Docker; TaskEnvironmentError when that is not possible."""
    environment = task.environment
    if not environment.base_packages_only:
        raise TaskEnvironmentError(
            f"task {task.name} needs Docker: it does not declare [metadata.skyrl] base_packages_only = true, so the "
            "bwrap backend (the host's own tools) cannot stand in for its image")
    if environment.tests_run_agent_code:
        raise TaskEnvironmentError(
            f"task {task.name} needs Docker: its tests run the agent's code ([metadata.skyrl] tests_run_agent_code), "
            "and in a bwrap machine the agent and the tests share one host user, so that code could write the reward")
    if environment.context_dir is None:
        raise TaskEnvironmentError(f"task {task.name} needs Docker: it names a prebuilt image")
    recipe_file = environment.context_dir / environment.dockerfile
    try:
        instructions = parse_dockerfile(recipe_file.read_text(), source=str(recipe_file))
        return plan_for_bwrap(instructions, TERMINAL_IMAGE, source=str(recipe_file))
    except ValueError as exc:
        raise TaskEnvironmentError(f"task {task.name} cannot run on bwrap: {exc}") from exc


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
                f"task {task.name}: RUN {step.command!r} failed on bwrap (exit {result.exit_code}): "
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


async def _image_workdir(image: str | None) -> str:
    if image is None:
        return DEFAULT_WORKDIR
    from skyrl_sandbox.docker_engine import shared_client

    config = await asyncio.to_thread(lambda: shared_client().api.inspect_image(image)["Config"])
    return (config or {}).get("WorkingDir") or DEFAULT_WORKDIR


_provisioners: dict[tuple[int, int, float], Provisioner] = {}


def provisioner(config: HarborTerminalConfig) -> Provisioner:
    """The provisioner of the running loop for these settings."""
    key = (id(asyncio.get_running_loop()), config.max_live_machines, config.starts_per_second)
    if key not in _provisioners:
        _provisioners[key] = Provisioner(config.max_live_machines, config.starts_per_second)
    return _provisioners[key]
