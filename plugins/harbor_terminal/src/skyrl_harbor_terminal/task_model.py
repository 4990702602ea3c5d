"""A Harbor task read into frozen dataclasses: :class:`HarborTask` with its steps, environment, healthchecks and
artifacts, and how per-step rewards combine. :func:`~skyrl_harbor_terminal.task.load_task` builds one from a
task folder; the lint and the env read it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .task_errors import TaskFormatError

if TYPE_CHECKING:
    from .compose import ComposeSpec

REWARD_STRATEGIES = ("mean", "final")
# Harbor's HealthcheckConfig numbers could not be confirmed; these are ours (Docker's HEALTHCHECK shape).
HEALTHCHECK_INTERVAL_SEC = 5.0
HEALTHCHECK_TIMEOUT_SEC = 30.0
HEALTHCHECK_RETRIES = 3
HEALTHCHECK_START_PERIOD_SEC = 0.0
# Test helpers a task may ask for by name ([metadata.skyrl] test_helpers): one copy in this package, put in /tests
# beside each such task's own test files (see HarborTask.test_files).
TEST_HELPERS_DIR = Path(__file__).resolve().parent / "test_helpers"


@dataclass(frozen=True)
class Author:
    name: str
    email: str | None = None


@dataclass(frozen=True)
class Healthcheck:
    """A command (run as root by ``bash -c``) that must exit 0 before the agent starts: Harbor's HealthcheckConfig.

    It is tried every ``interval_sec`` until it succeeds; a try that fails within ``start_period_sec``
    of the first does not count, and the check fails at the ``retries + 1``-th counted failure. Each
    try may run ``timeout_sec``.
    """

    command: str
    interval_sec: float = HEALTHCHECK_INTERVAL_SEC
    timeout_sec: float = HEALTHCHECK_TIMEOUT_SEC
    retries: int = HEALTHCHECK_RETRIES
    start_period_sec: float = HEALTHCHECK_START_PERIOD_SEC


@dataclass(frozen=True)
class Artifact:
    """A path copied out of the machine after the agent's work on a step (Harbor's ``artifacts`` entry)."""

    source: str  # absolute, normalised path in the machine
    destination: str  # relative path under the episode's artifacts folder (default: source without the "/")


@dataclass(frozen=True)
class CollectHook:
    """A ``[verifier] collect`` command: run in the agent's machine after its work on a step (its processes
    killed), before the artifacts are copied out, so a task can snapshot state into files the artifacts take."""

    command: str
    timeout_sec: float
    user: str | None  # None: root (the machine's default user)


@dataclass(frozen=True)
class VerifierMachine:
    """``[verifier] environment_mode = "separate"``: the step's tests run in a machine of their own.

    It starts from the image built from ``context_dir/Dockerfile`` (``steps/<name>/tests/`` or ``tests/``), or,
    with no such Dockerfile, from the task's own image (a fresh machine, not the agent's). The agent's work
    reaches it only as the step's collected artifacts, written there as data at their source paths.
    """

    context_dir: Path | None
    allow_internet: bool


@dataclass(frozen=True)
class EnvironmentSpec:
    """How to build and size the task container (``[environment]`` plus ``environment/``)."""

    context_dir: Path | None  # the environment/ folder when it holds the Dockerfile
    dockerfile: str  # file name inside context_dir
    docker_image: str | None  # a prebuilt image named by the task
    workdir: str | None  # [environment] workdir, else None (the Dockerfile's WORKDIR decides)
    build_timeout_sec: float
    cpus: float
    memory_mb: int
    storage_mb: int
    allow_internet: bool  # the agent's machine: what the task asked for (network_mode); False when it did not say
    base_packages_only: bool
    gpus: int = 0  # asked for, never provided
    tests_run_agent_code: bool = False  # the tests execute the agent's code: Docker only
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # [environment] env: every command sees it
    healthcheck: Healthcheck | None = None  # [environment] healthcheck: once, after the machine starts
    mcp_servers: tuple[dict[str, Any], ...] = ()  # read, not honoured: the agent has only a shell
    compose: ComposeSpec | None = None  # environment/docker-compose.yaml: services beside the machine (Docker only)


@dataclass(frozen=True)
class Step:
    """One agent turn sequence and its verifier; a single-step task has one, named ``main``."""

    name: str
    instruction: str
    tests_dirs: tuple[Path, ...]  # copied to /tests in this order, later files override earlier ones
    solution_dir: Path | None
    setup_script: Path | None  # run as root before the step's agent turns
    agent_timeout_sec: float
    agent_user: str | None
    verifier_timeout_sec: float
    verifier_env: dict[str, str]
    verifier_user: str | None
    min_reward: float | None  # stop the episode after this step when its reward is below
    contributes_to_reward: bool
    workdir_dir: Path | None = None  # steps/<name>/workdir/: uploaded into the work directory before the step
    healthcheck: Healthcheck | None = None  # run after the step's setup, before the agent's turns
    artifacts: tuple[Artifact, ...] = ()  # collected after the agent's work on this step
    collect: tuple[CollectHook, ...] = ()  # run before the artifacts are collected: the task's, then the step's
    tests_machine: VerifierMachine | None = None  # environment_mode = "separate"; None: the tests run in the agent's


@dataclass(frozen=True)
class HarborTask:
    name: str
    path: Path
    schema_version: str
    environment: EnvironmentSpec
    steps: tuple[Step, ...]
    multi_step: bool
    reward_strategy: str
    solution_env: dict[str, str]
    metadata: dict[str, Any]
    warnings: tuple[str, ...]
    description: str = ""
    authors: tuple[Author, ...] = ()
    keywords: tuple[str, ...] = ()
    artifacts: tuple[Artifact, ...] = ()  # task-level: collected after the agent's work on the last step reached
    reward_weights: dict[str, float] | None = None  # [metadata.skyrl] reward_weights (see .rewards)
    test_helpers: tuple[str, ...] = ()  # [metadata.skyrl] test_helpers: file names in TEST_HELPERS_DIR
    version: str | None = None  # [task] version: the package's version (informational)
    source: str | None = None  # top-level source: where the task came from (informational)

    @property
    def separate_tests(self) -> bool:
        """Some step's tests run in a machine of their own (docker only)."""
        return any(step.tests_machine is not None for step in self.steps)

    def test_files(self, step: Step) -> dict[str, bytes]:
        """The contents of ``/tests`` for ``step``: relative POSIX path -> bytes, layers merged.

        The task's test helpers come first, so a task folder that carries its own copy of one uses its own.
        """
        files = {name: (TEST_HELPERS_DIR / name).read_bytes() for name in self.test_helpers}
        for folder in step.tests_dirs:
            files.update(read_tree(folder, self.path))
        return files

    def solution_files(self, step: Step) -> dict[str, bytes]:
        """The reference solution for ``step`` (``solve.sh`` and its helpers); empty when it has none."""
        return read_tree(step.solution_dir, self.path) if step.solution_dir else {}

    def workdir_files(self, step: Step) -> tuple[dict[str, bytes], dict[str, int], list[str]]:
        """``steps/<name>/workdir/`` of ``step``: (relative path -> bytes, relative path -> mode, empty folders)."""
        if step.workdir_dir is None:
            return {}, {}, []
        files = read_tree(step.workdir_dir, self.path)
        modes = {name: (step.workdir_dir / name).resolve().stat().st_mode & 0o7777 for name in files}
        empty = [Path(dirpath).relative_to(step.workdir_dir).as_posix()
                 for dirpath, dirnames, filenames in os.walk(step.workdir_dir) if not dirnames and not filenames
                 and Path(dirpath) != step.workdir_dir]
        return files, modes, sorted(empty)


def combine_rewards(strategy: str, step_rewards: list[float | None], contributes: list[bool]) -> float:
    """The episode reward from per-step rewards.

    ``contributes`` has one flag per step; ``step_rewards`` may be shorter (steps not reached), and
    ``None`` marks a step without a result. Both count 0. "mean" averages the contributing steps,
    "final" takes the last contributing step's reward; 0 when no step contributes.
    """
    if strategy not in REWARD_STRATEGIES:
        raise ValueError(f"unknown reward strategy {strategy!r}; expected one of {', '.join(REWARD_STRATEGIES)}")
    if len(step_rewards) > len(contributes):
        raise ValueError(f"{len(step_rewards)} step rewards for {len(contributes)} steps")
    padded = list(step_rewards) + [None] * (len(contributes) - len(step_rewards))
    counted = [reward or 0.0 for reward, flag in zip(padded, contributes, strict=True) if flag]
    if not counted:
        return 0.0
    return counted[-1] if strategy == "final" else sum(counted) / len(counted)


def read_tree(root: Path, task_root: Path) -> dict[str, bytes]:
    """Regular files under ``root`` by relative POSIX path; symlinks must stay inside the task folder."""
    boundary = task_root.resolve()
    check_inside(root, boundary)
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames:
            if (base / name).is_symlink():
                raise TaskFormatError(f"{base / name}: symlinked folders are not supported in a task")
        for name in sorted(filenames):
            files[(base / name).relative_to(root).as_posix()] = _read_regular(base / name, boundary)
    return files


def _read_regular(path: Path, boundary: Path) -> bytes:
    target = check_inside(path, boundary)
    if not target.is_file():
        raise TaskFormatError(f"{path}: not a regular file")
    return target.read_bytes()


def check_inside(path: Path, boundary: Path) -> Path:
    """``path`` with symlinks resolved; an error when a symlink leads out of the task folder."""
    target = path.resolve()
    if not target.is_relative_to(boundary):
        raise TaskFormatError(f"{path}: symlink points outside the task folder ({target})")
    return target
