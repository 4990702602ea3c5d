"""Building a task's images (its own, and its compose services'), the one way both are built.

Offline unless ``build_network``; public ``FROM`` images replaced by their offline substitutes
(:mod:`.substitutes`) where the engine lacks them; rebuilt only when the folder, the Dockerfile as
sent or the build args change; one build log per image. With the network, build steps trust the
host's extra CAs (:mod:`.build_trust`). A build that fails offline in a way that looks like a
missing network, or online on a TLS certificate, says so and how to fix it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.errors import SandboxError

from . import build_trust, substitutes
from .config import HarborTerminalConfig
from .images import TERMINAL_IMAGE

if TYPE_CHECKING:
    from skyrl_sandbox.container_engine import ContainerEngine

    from .task_model import HarborTask

log = logging.getLogger(__name__)
BuildOnce = Callable[["ContainerEngine", str, Callable[[], Coroutine[Any, Any, str]]], Awaitable[str]]
"""``build_once(engine, tag, build)``: ``build()``'s result for ``tag`` on ``engine``, started at most once per
process (:meth:`~skyrl_harbor_terminal.provision.Provisioner.build_once`)."""
_substituted: dict[str, tuple[str, ...]] = {}  # image tag -> "ref: Debian suite" for each image its build substituted


class TaskEnvironmentError(SandboxError):
    """The task's environment cannot be built or started here; the message names the task."""


def build_log_path(config: HarborTerminalConfig, tag: str) -> Path:
    """Where the build of ``tag`` logs (``env.build_logs``, else ``~/.cache/skyrl/harbor/build-logs``)."""
    logs = Path(config.build_logs or Path.home() / ".cache" / "skyrl" / "harbor" / "build-logs")
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{tag.replace('/', '_').replace(':', '_')}.log"


def substituted(tag: str) -> tuple[str, ...]:
    """What stood in for the public images of ``tag``'s build in this process (empty before it is built)."""
    return _substituted.get(tag, ())


async def build_task_image(engine: ContainerEngine, what: str, context: Path, dockerfile: str, tag: str,
                           config: HarborTerminalConfig, *, timeout_s: float,
                           buildargs: Mapping[str, str] | None = None) -> str:
    """Build ``context/dockerfile`` as ``tag`` on ``engine``; ``what`` names the image in errors ("task t: its
    image")."""
    log_file = build_log_path(config, tag)
    network = substitutes.build_network_enabled(config.build_network)

    def say(line: str) -> None:
        log.debug("%s", line)

    trust: build_trust.TrustBundle | None = None
    started: float | None = None  # when the engine's build began (its log is then this build's)
    try:
        plan = await asyncio.to_thread(substitutes.plan_build, context / dockerfile,
                                       enabled=substitutes.substitutes_enabled(config.substitute_images),
                                       exists=partial(substitutes.on_engine, engine))
        _substituted[tag] = tuple(f"{s.ref}: a stand-in from Debian {s.suite}" for s in plan.substitutes)
        for warning in plan.warnings:
            log.warning("%s: %s", what, warning)
        for substitute in plan.substitutes:  # FROM lines would build them too; COPY --from would not
            await asyncio.to_thread(images.ensure_base_image, engine, substitute.tag, progress=say)
        trust = await asyncio.to_thread(build_trust.resolve, config.build_ca_bundle) if network else None
        text = plan.text if trust is None else await asyncio.to_thread(_trusting, engine, trust, context / dockerfile,
                                                                        plan, say)
        started = time.time()
        return await asyncio.to_thread(
            images.build_image, engine, context, tag, dockerfile=dockerfile, base=TERMINAL_IMAGE, timeout_s=timeout_s,
            log_file=log_file, progress=say, dockerfile_text=text, network=network, notes=plan.notes,
            buildargs=dict(buildargs) if buildargs else None)
    except SandboxError as exc:
        fresh = started is not None and log_file.exists() and log_file.stat().st_mtime >= started - 1
        output = log_file.read_text(errors="replace") if fresh else str(exc)  # the whole log: the tail may miss it
        hint = (build_trust.tls_failure_hint(output, trust, config.build_ca_bundle) if network
                else substitutes.offline_build_hint(str(exc)))
        if hint and log_file.exists():
            with log_file.open("a", encoding="utf-8") as handle:
                handle.write(f"hint: {hint}\n")
        raise TaskEnvironmentError(f"{what} did not build ({exc})" + (f". {hint}" if hint else "")
                                   + f"; build log: {log_file}") from exc


def _trusting(engine: ContainerEngine, trust: build_trust.TrustBundle, recipe: Path, plan: substitutes.BuildPlan,
              say: Callable[[str], None]) -> str | None:
    """The Dockerfile text with ``trust`` in its build steps (noted in the build log), or the plan's when none runs."""
    trusted = build_trust.rewrite(plan.text or recipe.read_text(errors="replace"), trust.tag,
                                  partial(build_trust.image_user, engine))
    if trusted is None:
        return plan.text
    build_trust.ensure_image(engine, trust, progress=say)
    plan.notes.append(f"RUN steps trust {trust.extra} extra CA(s) from {trust.source} (env.build_ca_bundle); "
                      "the final image keeps neither them nor their variables")
    return trusted


def task_image_tag(task: HarborTask) -> str:
    """A tag per task folder: its name, made tag-safe, and a hash of where it lives."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip("-.") or "task"
    where = hashlib.sha256(str(task.path.resolve()).encode()).hexdigest()[:10]
    return f"skyrl-harbor/{slug[:80]}:{where}"
