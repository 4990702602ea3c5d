"""A compose task's services on a backend that runs images: their images built once per process, then the
machine's sidecars.

Each service with a ``build`` gets an image of its own, built the way task images are (offline
unless ``build_network``, public ``FROM`` images replaced by their offline substitutes, once per
process and tag, rebuilt when its folder or build args change, a build log per image); a service
with only an ``image`` must find it on the engine, as nothing is pulled. :func:`with_services` then adds the services to the machine's spec, with the
machine's own limits for each, and what the compose file adds to ``main`` (its environment,
under the task's own; its ``depends_on``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from functools import partial
from typing import TYPE_CHECKING

from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.errors import SandboxError
from skyrl_sandbox.machine import MachineSpec

from .builds import BuildOnce, TaskEnvironmentError, build_task_image, task_image_tag
from .config import HarborTerminalConfig
from .task_model import HarborTask

if TYPE_CHECKING:
    from skyrl_sandbox.container_engine import ContainerEngine


async def service_images(build_once: BuildOnce, engine: ContainerEngine, task: HarborTask,
                         config: HarborTerminalConfig) -> dict[str, str]:
    """Service name -> image tag on ``engine``, for every service of the task's compose file (each built through
    ``build_once``, the provisioner's once-per-process builds)."""
    compose = task.environment.compose
    if compose is None:
        return {}
    found: dict[str, str] = {}
    for service in compose.services:
        if service.build is None:
            assert service.image is not None  # the compose reader requires one of them
            if not await asyncio.to_thread(images.image_exists, engine, service.image):
                raise _error(task, f"the image {service.image} of its service {service.name} is not on this "
                                   f"{engine.title}, and nothing is pulled: load it (docker load) or give the service "
                                   f"a build in {compose.path.name}")
            found[service.name] = service.image
            continue
        tag = service_image_tag(task, service.name)
        found[service.name] = await build_once(engine, tag, partial(
            build_task_image, engine, f"task {task.name}: the image of its service {service.name}",
            service.build.context, service.build.dockerfile, tag, config, timeout_s=task.environment.build_timeout_sec,
            buildargs=service.build.args))
    return found


def with_services(spec: MachineSpec, task: HarborTask, service_tags: dict[str, str]) -> MachineSpec:
    """``spec`` with the task's services as sidecars and what the compose file adds to ``main``."""
    compose = task.environment.compose
    if compose is None:
        return spec
    sidecars = compose.sidecars(service_tags, cpus=spec.cpus, memory_mb=spec.memory_mb,
                                max_processes=spec.max_processes)
    return dataclasses.replace(spec, sidecars=sidecars, depends_on=dict(compose.main.depends_on),
                               env={**compose.main.environment, **spec.env})


def service_image_tag(task: HarborTask, service: str) -> str:
    """The task's image tag with the service's name added to the repository."""
    repository, _, where = task_image_tag(task).rpartition(":")
    return f"{repository}-svc-{re.sub(r'[^a-z0-9]+', '-', service).strip('-')}:{where}"


def _error(task: HarborTask, message: str) -> SandboxError:
    return TaskEnvironmentError(f"task {task.name}: {message}")
