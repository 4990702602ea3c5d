"""Harbor-ready copies of our tasks (``skyrl harbor export``): what only this plugin supplies, written into the copy.

A task folder that loads here may lean on four things Harbor's own runner does not have:

- **test helpers** (``[metadata.skyrl] test_helpers``): the copy's ``tests/`` gets each helper as a file (a
  file of the same name the task already has there wins, as it does here), and the key is dropped;
- **local base images** (a ``FROM`` of an image declared with :func:`skyrl_sandbox.backends.docker.images.register_base_image`,
  such as ``skyrl-terminal-base:bookworm-1``): each such ``FROM`` in the copy's Dockerfiles becomes the public
  ``debian:<suite>-slim`` plus an ``apt-get install`` of the same packages and the same ``ENV``;
- **a step's ``setup.sh``**, which Harbor runs from ``steps/<name>/workdir/setup.sh``: moved there;
- **our defaults**: the agent runs as the unprivileged ``agent`` user, created when the machine starts, and
  has no network unless the task asks. The copy states both in Harbor's fields (``[agent] user``,
  ``[environment] network_mode``), and its Dockerfile creates each agent user the task names (Harbor runs as
  a user the image has) and hands it the work directory, as our machine does.

What the copy cannot express is refused with :class:`ExportError`, naming the field and the fix. The copy
still loads here with the same steps, tests, users and network (``tests/harbor_terminal/test_harbor_export.py``).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

import tomllib
from skyrl_sandbox.backends.docker import images

from . import substitutes
from .config import HarborTerminalConfig
from .task import load_task
from .task_model import TEST_HELPERS_DIR, HarborTask
from .toml_text import dumps

DEFAULT_AGENT_USER: str = HarborTerminalConfig.model_fields["agent_user"].default
AGENT_UID = 1000  # the uid our docker machine gives the agent user it creates
_HEADER = ("# Written by `skyrl harbor export` from {source}: test helpers copied into tests/, local base images\n"
           "# replaced by public Debian ones, and the agent user and network stated in Harbor's own fields.\n\n")


class ExportError(ValueError):
    """The task cannot be written as a Harbor-ready copy; the message names what and how to change it."""


def export_task(source: str | Path, out_dir: str | Path) -> Path:
    """Write a Harbor-ready copy of the task folder ``source`` to ``out_dir`` (which must not exist yet)."""
    source, out_dir = Path(source), Path(out_dir)
    task = load_task(source, quiet=True)
    if out_dir.exists():
        raise ExportError(f"{out_dir} already exists: name a new folder")
    data = tomllib.loads((source / "task.toml").read_text(encoding="utf-8"))
    users = _agent_users(task)
    _check(task, users)
    with tempfile.TemporaryDirectory(dir=out_dir.parent if out_dir.parent.exists() else None) as scratch:
        copy = Path(scratch) / "task"
        shutil.copytree(source, copy)  # links are followed: the copy is plain files
        _write_helpers(task, copy)
        _move_step_setups(task, copy)
        recipes = sorted(path for path in copy.rglob("*") if path.is_file() and path.name.startswith("Dockerfile"))
        rebuilt = [recipe for recipe in recipes if _replace_local_bases(recipe, copy)]
        if users:
            assert task.environment.context_dir is not None and task.environment.workdir  # _check refused the rest
            main = copy / task.environment.context_dir.relative_to(source) / task.environment.dockerfile
            _append_agent_users(main, users, task.environment.workdir)
        fields = _harbor_fields(task, data, images_changed=bool(rebuilt or users))
        (copy / "task.toml").write_text(_HEADER.format(source=task.name) + dumps(fields), encoding="utf-8")
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(copy, out_dir)
    return out_dir


def _agent_users(task: HarborTask) -> list[str]:
    """The non-root users the task's agent runs as here, the machine's own (the first step's) first."""
    users = [step.agent_user or DEFAULT_AGENT_USER for step in task.steps]
    return [user for user in dict.fromkeys(users) if user not in ("root", "0")]


def _check(task: HarborTask, users: list[str]) -> None:
    environment = task.environment
    where = task.path / "task.toml"
    if environment.docker_image and images.declared_base_image(environment.docker_image) is not None:
        raise ExportError(f"{where}: [environment] docker_image = {environment.docker_image!r} is built only by "
                          f"skyrl; write environment/Dockerfile with `FROM {environment.docker_image}` instead")
    if users and environment.context_dir is None:
        raise ExportError(f"{where}: the agent runs as {users[0]!r}, which Harbor needs in the image, but the task "
                          "has no Dockerfile to add it to; state [agent] user = \"root\" or a user the image has, "
                          "or build the image from environment/Dockerfile")
    if users and environment.context_dir is not None and not environment.context_dir.resolve().is_relative_to(
            task.path.resolve()):
        raise ExportError(f"{where}: the agent's image is built from {environment.context_dir}, outside the task "
                          "folder; move its build context into the task")
    if users and environment.workdir is None:
        raise ExportError(f"{where}: [environment] workdir is not stated; the agent user must own it under Harbor "
                          "too: state workdir (e.g. \"/app\")")


def _write_helpers(task: HarborTask, copy: Path) -> None:
    tests = copy / "tests"
    for name in task.test_helpers:
        tests.mkdir(exist_ok=True)
        target = tests / name
        if not target.exists():  # the task's own copy wins, as it does here
            shutil.copyfile(TEST_HELPERS_DIR / name, target)


def _move_step_setups(task: HarborTask, copy: Path) -> None:
    """A step's ``setup.sh`` goes where Harbor 0.25 runs it from: ``steps/<name>/workdir/setup.sh``."""
    for step in task.steps:
        moved = copy / "steps" / step.name / "setup.sh"
        if step.setup_script is not None and moved.is_file():
            (moved.parent / "workdir").mkdir(exist_ok=True)
            moved.rename(moved.parent / "workdir" / "setup.sh")


def _replace_local_bases(recipe: Path, copy: Path) -> bool:
    """Each ``FROM`` of a declared local base image becomes public Debian plus the same packages and ENV; True when
    the file changed."""
    lines = recipe.read_text(encoding="utf-8").splitlines(keepends=True)
    changed = False
    for use in reversed(substitutes.image_uses("".join(lines))):
        spec = images.declared_base_image(use.ref)
        if spec is None:
            continue
        where = f"{recipe.relative_to(copy)} line {use.line}"
        if use.instruction != "FROM" or use.written != use.ref:
            raise ExportError(f"{where}: {use.instruction} {use.written} names {use.ref}, which only skyrl builds; "
                              f"write it as a plain `FROM {use.ref}` so it can be replaced by public Debian")
        line = lines[use.line - 1]
        packages = " ".join(shlex.quote(name) for name in spec.packages)
        env = dict((("LANG", "C.UTF-8"), *spec.env))
        lines[use.line - 1:use.line] = [
            line.replace(use.written, f"debian:{spec.suite}-slim", 1),
            f"# {use.ref} (a base image skyrl builds locally), from Debian packages:\n",
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            f"{packages} && rm -rf /var/lib/apt/lists/*\n",
            "ENV " + " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items()) + "\n",
        ]
        changed = True
    if changed:
        recipe.write_text("".join(lines), encoding="utf-8")
    return changed


def _append_agent_users(recipe: Path, users: list[str], workdir: str) -> None:
    """Create the agent users (the first with our uid) and give the first the work directory, as our machine does."""
    commands = []
    for index, user in enumerate(users):
        name = shlex.quote(user)
        uid = f"-u {AGENT_UID} " if index == 0 else ""
        commands.append(f"(id -u {name} >/dev/null 2>&1 || useradd -m {uid}-s /bin/bash {name} 2>/dev/null "
                        f"|| useradd -m -s /bin/bash {name})")
    commands.append(f"mkdir -p {shlex.quote(workdir)} && chown -R {shlex.quote(users[0])}: {shlex.quote(workdir)}")
    text = recipe.read_text(encoding="utf-8")
    recipe.write_text(text + ("" if text.endswith("\n") else "\n")
                      + "\n# The unprivileged agent user task.toml names ([agent] user), owning the work directory.\n"
                      + "USER root\nRUN " + " \\\n && ".join(commands) + "\n", encoding="utf-8")


def _harbor_fields(task: HarborTask, data: dict, *, images_changed: bool) -> dict:
    """``data`` (the task.toml) with the agent user and network stated, and the test helper list dropped."""
    data = dict(data)
    if data.get("agent", {}).get("user") is None:  # steps without a user of their own fall back to this one
        data["agent"] = {**data.get("agent", {}), "user": DEFAULT_AGENT_USER}
    environment = {key: value for key, value in data.get("environment", {}).items() if key != "allow_internet"}
    environment["network_mode"] = "public" if task.environment.allow_internet else "no-network"
    data["environment"] = environment
    metadata = dict(data.get("metadata", {}))
    skyrl = {key: value for key, value in metadata.get("skyrl", {}).items() if key != "test_helpers"}
    if images_changed:  # the copy's Dockerfile installs packages and adds users: only Docker builds it
        skyrl.pop("base_packages_only", None)
    if skyrl:
        metadata["skyrl"] = skyrl
    else:
        metadata.pop("skyrl", None)
    data["metadata"] = metadata
    if not metadata:
        data.pop("metadata")
    return data
