"""One Harbor task folder (``task.toml`` schema 1.0 or 1.x) read into a frozen :class:`HarborTask`.

Layout: ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` (the build context is
``environment/``), ``tests/test.sh`` (+ helpers), optional ``solution/solve.sh``; a multi-step task
adds ``[[steps]]`` tables (with ``healthcheck`` and ``artifacts``) and ``steps/<name>/`` folders
(``instruction.md``, ``tests/``, ``solution/``, ``setup.sh``, ``workdir/``). Where our behaviour
differs from Harbor's:

- ``allow_internet`` defaults to False (Harbor: True); the env decides what a task finally gets.
  ``network_mode``, ``[verifier] environment_mode`` and ``collect`` are read in :mod:`.harbor_fields`,
  which refuses by name what cannot be honoured here ("allowlist", ``[verifier.environment]``, ...).
- GPUs are never provided; a task asking for some loads with a warning.
- ``[verifier] env`` and ``[environment] env`` values are kept verbatim: no ``${HOST_VAR}`` is
  filled from this machine.
- ``[environment] mcp_servers`` is read but not honoured (the agent has only a shell): a warning says so.
- ``[metadata.skyrl] reward_weights`` (our extension) weights the keys of a ``reward.json`` that
  has no ``reward`` key (see :mod:`.rewards`).
- ``[metadata.skyrl] base_packages_only = true`` (our extension) declares that the Dockerfile needs
  nothing beyond the terminal base image's packages, so a backend without Docker may run it;
  ``tests_run_agent_code = true`` declares that the tests execute code the agent wrote (as the
  agent user), which only a backend with separate users (Docker) can keep away from the reward.
- ``[metadata.skyrl] test_helpers = ["tree_check.py"]`` (our extension) names test helpers of this
  package (``test_helpers/``) to put in ``/tests`` beside the task's own test files, which win over
  them: one copy of a checker serves every task that asks for it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import posixpath
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from . import harbor_fields
from .compose import load_compose
from .lint import lint_task
from .rewards import weights_problem
from .task_errors import HarborTaskWarning, TaskFormatError
from .task_model import (  # the model lives in .task_model; these names stay importable from here
    HEALTHCHECK_INTERVAL_SEC,
    HEALTHCHECK_RETRIES,
    HEALTHCHECK_START_PERIOD_SEC,
    HEALTHCHECK_TIMEOUT_SEC,
    REWARD_STRATEGIES,
    TEST_HELPERS_DIR,
    Artifact,
    Author,
    CollectHook,
    EnvironmentSpec,
    HarborTask,
    Healthcheck,
    Step,
    check_inside,
    combine_rewards,  # noqa: F401 (re-exported: env and tests import it from here)
)

DEFAULT_TIMEOUT_SEC = 600.0
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_STORAGE_MB = 10240
SINGLE_STEP_NAME = "main"
STEP_WORKDIR = "workdir"  # steps/<name>/workdir/: uploaded into the work directory before the step
MAX_ARTIFACTS = 64

_TOP_KEYS = {"version", "schema_version", "task", "metadata", "verifier", "agent", "solution",
             "environment", "multi_step_reward_strategy", "steps", "artifacts", "source"}
_TASK_KEYS = {"name", "description", "authors", "keywords", "version"}
_NETWORK_KEYS = {"network_mode", "allowed_hosts"}  # read (or refused) in .harbor_fields
_VERIFIER_KEYS = {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", *_NETWORK_KEYS}
_AGENT_KEYS = {"timeout_sec", "user", *_NETWORK_KEYS}
_SOLUTION_KEYS = {"env"}
_ENVIRONMENT_KEYS = {"build_timeout_sec", "docker_image", "cpus", "memory", "memory_mb", "storage",
                     "storage_mb", "allow_internet", "gpus", "gpu_types", "workdir", "os", "env", "healthcheck",
                     "mcp_servers", "artifacts", *_NETWORK_KEYS}
_STEP_KEYS = {"name", "min_reward", "contributes_to_reward", "agent", "verifier", "healthcheck", "artifacts"}
_SKYRL_KEYS = {"base_packages_only", "tests_run_agent_code", "reward_weights", "test_helpers"}
_HEALTHCHECK_KEYS = {"command", "interval_sec", "timeout_sec", "retries", "start_period_sec"}
_ARTIFACT_KEYS = {"source", "destination"}

_SCHEMA_RE = re.compile(r"1(\.\d+)*")
_SAFE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B|I)?", re.IGNORECASE)
_MB_PER_UNIT = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}


def load_task(path: str | os.PathLike[str], *, quiet: bool = False) -> HarborTask:
    """Read and check the task folder at ``path``; raises :class:`TaskFormatError`.

    Each warning is raised as a :class:`HarborTaskWarning` and kept in ``task.warnings``; ``quiet``
    only keeps them (a dataset says them once per kind, see :mod:`.task_warnings`).
    """
    task_dir = Path(path)
    reader = _Reader(task_dir, quiet=quiet)
    data = _read_toml(task_dir)
    reader.check_keys(data, _TOP_KEYS, "top level")
    info = reader.table(data, "task", "[task]", _TASK_KEYS)
    metadata = reader.table(data, "metadata", "[metadata]")
    solution = reader.table(data, "solution", "[solution]", _SOLUTION_KEYS)
    defaults = _task_step_defaults(reader, data)
    steps_raw = data.get("steps")
    if steps_raw is None:
        steps = (_single_step(task_dir, reader, defaults),)
    else:
        steps = _multi_steps(task_dir, reader, steps_raw, defaults)
    fields = dict(
        name=reader.string(info, "name", "[task]") or task_dir.name,
        path=task_dir,
        schema_version=_schema_version(reader, data),
        environment=_environment_spec(task_dir, reader, data, metadata, defaults.machine_network),
        steps=steps,
        multi_step=steps_raw is not None,
        reward_strategy=_reward_strategy(reader, data),
        solution_env=reader.str_dict(solution, "env", "[solution]"),
        metadata=metadata,
        description=_description(reader, info),
        authors=_authors(reader, info),
        keywords=tuple(reader.str_list(info, "keywords", "[task]")),
        artifacts=_artifacts(reader, data, "top level") + _artifacts(reader, _table_or_empty(data, "environment"),
                                                                     "[environment]"),
        reward_weights=_reward_weights(reader, metadata),
        test_helpers=_test_helpers(reader, metadata),
        version=reader.string(info, "version", "[task]"),
        source=reader.string(data, "source", "top level"),
    )
    task = HarborTask(**fields, warnings=tuple(reader.warnings))  # last: every check above may warn
    findings = [f"{task_dir}/{finding}" for finding in lint_task(task)]  # tests a policy can game (see .lint)
    for finding in [] if quiet else findings:
        warnings.warn(finding, HarborTaskWarning, stacklevel=2)
    return dataclasses.replace(task, warnings=task.warnings + tuple(findings))


class _Reader:
    """Typed access to task.toml values; errors and warnings name the task folder, table and key."""

    def __init__(self, task_dir: Path, quiet: bool = False) -> None:
        self.task_dir = task_dir
        self.quiet = quiet
        self.warnings: list[str] = []

    def error(self, where: str, message: str) -> TaskFormatError:
        return TaskFormatError(f"{self.task_dir / 'task.toml'}: {where} {message}")

    def warn(self, message: str) -> None:
        text = f"{self.task_dir / 'task.toml'}: {message}"
        self.warnings.append(text)
        if not self.quiet:
            warnings.warn(text, HarborTaskWarning, stacklevel=4)

    def check_keys(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.warn(f"{where}: unknown key {key!r} is ignored{hint}")

    def table(self, parent: dict[str, Any], key: str, where: str, allowed: set[str] | None = None) -> dict[str, Any]:
        value = parent.get(key, {})
        if not isinstance(value, dict):
            raise self.error(where, f"must be a table, got {_describe(value)}")
        if allowed is not None:
            self.check_keys(value, allowed, where)
        return value

    def number(self, table: dict[str, Any], key: str, where: str, default: float) -> float:
        """A positive int or float."""
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isinf(value):
            raise self.error(where, f"{key} must be a positive number, got {_describe(value)}")
        return float(value)

    def integer(self, table: dict[str, Any], key: str, where: str, default: int, minimum: int = 1) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(where, f"{key} must be a whole number >= {minimum}, got {_describe(value)}")
        return value

    def boolean(self, table: dict[str, Any], key: str, where: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.error(where, f"{key} must be true or false, got {_describe(value)}")
        return value

    def string(self, table: dict[str, Any], key: str, where: str) -> str | None:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise self.error(where, f"{key} must be a non-empty string, got {_describe(value)}")
        return value

    def str_list(self, table: dict[str, Any], key: str, where: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(where, f"{key} must be a list of strings, got {_describe(value)}")
        return value

    def str_dict(self, table: dict[str, Any], key: str, where: str) -> dict[str, str]:
        value = table.get(key, {})
        if not isinstance(value, dict):
            raise self.error(where, f"{key} must be a table of strings, got {_describe(value)}")
        for name, item in value.items():
            if not isinstance(item, str):
                raise self.error(where, f"{key}.{name} must be a string, got {_describe(item)}")
        return dict(value)


@dataclass(frozen=True)
class _StepDefaults:
    agent_timeout_sec: float
    agent_user: str | None
    verifier_timeout_sec: float
    verifier_env: dict[str, str]
    verifier_user: str | None
    machine_network: bool  # the agent's machine: [agent] network_mode, else [environment]'s
    baseline_network: bool  # [environment]'s: a separate tests machine's unless its verifier says otherwise
    verifier_mode: str | None = None  # [verifier] environment_mode (None: shared)
    tests_network: bool | None = None  # [verifier] network_mode
    collect: tuple[CollectHook, ...] = ()


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _read_toml(task_dir: Path) -> dict[str, Any]:
    toml_path = task_dir / "task.toml"
    if not toml_path.is_file():
        raise TaskFormatError(f"{task_dir}: not a Harbor task: {toml_path.name} is missing")
    try:
        return tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskFormatError(f"{toml_path}: invalid TOML: {exc}") from exc


def _read_text(path: Path, task_dir: Path) -> str:
    if not path.is_file():
        raise TaskFormatError(f"{path.parent}: {path.name} is missing")
    check_inside(path, task_dir.resolve())
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(f"{path}: not UTF-8 text: {exc}") from exc
    if not text.strip():
        raise TaskFormatError(f"{path}: is empty")
    return text


def _schema_version(reader: _Reader, data: dict[str, Any]) -> str:
    key = "schema_version" if "schema_version" in data else "version"
    value = data.get(key, "1.0")
    if not isinstance(value, str) or not _SCHEMA_RE.fullmatch(value):
        raise reader.error("top level", f"{key} must be a 1.x version string such as \"1.1\", got {_describe(value)}")
    return value


def _reward_strategy(reader: _Reader, data: dict[str, Any]) -> str:
    value = data.get("multi_step_reward_strategy", "mean")
    if value not in REWARD_STRATEGIES:
        raise reader.error("top level", f"multi_step_reward_strategy must be one of "
                                        f"{', '.join(REWARD_STRATEGIES)}, got {_describe(value)}")
    return value


def _description(reader: _Reader, info: dict[str, Any]) -> str:
    """``[task] description``: any string, empty included (``harbor init`` writes ``description = ""``)."""
    value = info.get("description", "")
    if not isinstance(value, str):
        raise reader.error("[task]", f"description must be a string, got {_describe(value)}")
    return value


def _authors(reader: _Reader, info: dict[str, Any]) -> tuple[Author, ...]:
    value = info.get("authors", [])
    if not isinstance(value, list):
        raise reader.error("[task]", f"authors must be a list of {{name, email}} tables, got {_describe(value)}")
    authors = []
    for index, entry in enumerate(value):
        where = f"[task] authors[{index}]"
        if not isinstance(entry, dict):
            raise reader.error(where, f"must be a {{name, email}} table, got {_describe(entry)}")
        reader.check_keys(entry, {"name", "email"}, where)
        name = reader.string(entry, "name", where)
        if name is None:
            raise reader.error(where, "needs a name")
        authors.append(Author(name, reader.string(entry, "email", where)))
    return tuple(authors)


def _task_step_defaults(reader: _Reader, data: dict[str, Any]) -> _StepDefaults:
    agent = reader.table(data, "agent", "[agent]", _AGENT_KEYS)
    verifier = reader.table(data, "verifier", "[verifier]", _VERIFIER_KEYS)
    baseline = harbor_fields.environment_network(reader, _table_or_empty(data, "environment"))
    agent_network = harbor_fields.network_mode(reader, agent, "[agent]")
    return _StepDefaults(
        agent_timeout_sec=reader.number(agent, "timeout_sec", "[agent]", DEFAULT_TIMEOUT_SEC),
        agent_user=reader.string(agent, "user", "[agent]"),
        verifier_timeout_sec=reader.number(verifier, "timeout_sec", "[verifier]", DEFAULT_TIMEOUT_SEC),
        verifier_env=reader.str_dict(verifier, "env", "[verifier]"),
        verifier_user=reader.string(verifier, "user", "[verifier]"),
        machine_network=baseline if agent_network is None else agent_network,
        baseline_network=baseline,
        verifier_mode=harbor_fields.verifier_mode(reader, verifier, "[verifier]"),
        tests_network=harbor_fields.network_mode(reader, verifier, "[verifier]"),
        collect=harbor_fields.collect_hooks(reader, verifier, "[verifier]"),
    )


def _size_mb(reader: _Reader, table: dict[str, Any], key: str, default: int) -> int:
    """``<key>_mb`` (whole MB) or the deprecated ``<key>`` ("2G", "512M", "1024K", a bare number = MB)."""
    mb_key = f"{key}_mb"
    if key in table and mb_key in table:
        reader.warn(f"[environment]: both {key} and {mb_key} are set; {mb_key} = {table[mb_key]!r} is used")
    if mb_key in table or key not in table:
        return reader.integer(table, mb_key, "[environment]", default)
    value = table[key]
    match = _SIZE_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        amount, unit = float(value), ""
    elif match:
        amount, unit = float(match.group(1)), match.group(2).upper()
    else:
        raise reader.error("[environment]", f"{key} must be a size such as \"2G\" or \"512M\", got {_describe(value)}")
    size = math.ceil(amount * _MB_PER_UNIT[unit])
    if size <= 0:
        raise reader.error("[environment]", f"{key} must be positive, got {_describe(value)}")
    return size


def _environment_spec(task_dir: Path, reader: _Reader, data: dict[str, Any], metadata: dict[str, Any],
                      allow_internet: bool) -> EnvironmentSpec:
    env = reader.table(data, "environment", "[environment]", _ENVIRONMENT_KEYS)
    docker_image = reader.string(env, "docker_image", "[environment]")
    compose = load_compose(task_dir)
    override = compose.main_source(docker_image) if compose else None  # main's build/image replaces the Dockerfile
    context_dir, dockerfile, docker_image = override or (_context_dir(task_dir, docker_image), "Dockerfile", docker_image)
    workdir = reader.string(env, "workdir", "[environment]")
    if workdir is not None and not workdir.startswith("/"):
        raise reader.error("[environment]", f"workdir must be an absolute path, got {workdir!r}")
    target_os = reader.string(env, "os", "[environment]")
    if target_os not in (None, "linux"):
        raise reader.error("[environment]", f"os must be \"linux\", got {target_os!r}")
    reader.str_list(env, "gpu_types", "[environment]")
    gpus = reader.integer(env, "gpus", "[environment]", 0, minimum=0)
    if gpus:
        reader.warn(f"[environment]: gpus = {gpus} is requested, but GPUs are not provided to task containers")
    skyrl = reader.table(metadata, "skyrl", "[metadata.skyrl]", _SKYRL_KEYS)
    mcp_servers = env.get("mcp_servers", [])
    if not isinstance(mcp_servers, list) or not all(isinstance(item, dict) for item in mcp_servers):
        raise reader.error("[environment]", f"mcp_servers must be a list of tables ([[environment.mcp_servers]]), "
                                            f"got {_describe(mcp_servers)}")
    if mcp_servers:
        reader.warn(f"[environment]: mcp_servers ({len(mcp_servers)}) is read but not honoured: the agent has "
                    "only a shell, no MCP client")
    return EnvironmentSpec(
        context_dir=context_dir,
        dockerfile=dockerfile,
        docker_image=docker_image,
        workdir=workdir,
        build_timeout_sec=reader.number(env, "build_timeout_sec", "[environment]", DEFAULT_TIMEOUT_SEC),
        cpus=reader.number(env, "cpus", "[environment]", DEFAULT_CPUS),
        memory_mb=_size_mb(reader, env, "memory", DEFAULT_MEMORY_MB),
        storage_mb=_size_mb(reader, env, "storage", DEFAULT_STORAGE_MB),
        allow_internet=allow_internet,
        base_packages_only=reader.boolean(skyrl, "base_packages_only", "[metadata.skyrl]", False),
        gpus=gpus,
        tests_run_agent_code=reader.boolean(skyrl, "tests_run_agent_code", "[metadata.skyrl]", False),
        env=_environment_variables(reader, env),
        healthcheck=_healthcheck(reader, env, "[environment]"),
        mcp_servers=tuple(dict(item) for item in mcp_servers),
        compose=compose,
    )


def _context_dir(task_dir: Path, docker_image: str | None) -> Path | None:
    context = task_dir / "environment"
    if (context / "Dockerfile").is_file():
        return context
    if docker_image is None:
        raise TaskFormatError(f"{task_dir}: environment/Dockerfile is missing "
                              f"(and task.toml [environment] names no docker_image)")
    return None


def _single_step(task_dir: Path, reader: _Reader, defaults: _StepDefaults) -> Step:
    tests = task_dir / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskFormatError(f"{task_dir}: tests/test.sh is missing")
    return _step(reader, "[verifier]", SINGLE_STEP_NAME, _read_text(task_dir / "instruction.md", task_dir),
                 (tests,), _solution_dir(task_dir), None, defaults, None, True)


def _multi_steps(task_dir: Path, reader: _Reader, raw: Any, defaults: _StepDefaults) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(item, dict) for item in raw):
        raise reader.error("[[steps]]", "must be one or more tables")
    seen: set[str] = set()
    steps = []
    for index, table in enumerate(raw):
        step = _parse_step(task_dir, reader, index, table, defaults)
        if step.name in seen:
            raise reader.error(f"[[steps]] #{index + 1}", f"duplicate step name {step.name!r}")
        seen.add(step.name)
        steps.append(step)
    return tuple(steps)


def _parse_step(task_dir: Path, reader: _Reader, index: int, table: dict[str, Any], defaults: _StepDefaults) -> Step:
    name = table.get("name")
    if not isinstance(name, str) or not _SAFE_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise reader.error(f"[[steps]] #{index + 1}", f"name must be a safe folder name "
                                                      f"(letters, digits, '.', '_', '-'), got {_describe(name)}")
    where = f"[[steps]] {name!r}"
    reader.check_keys(table, _STEP_KEYS, where)
    agent = reader.table(table, "agent", f"{where} agent", _AGENT_KEYS)
    verifier = reader.table(table, "verifier", f"{where} verifier", _VERIFIER_KEYS)
    agent_network = harbor_fields.network_mode(reader, agent, f"{where} agent")
    if agent_network is not None and agent_network != defaults.machine_network:
        raise reader.error(f"{where} agent", "network_mode differs from the task's: every step runs in one machine, "
                                             "whose network is set when it starts; set it in [agent] or "
                                             "[environment] instead")
    tests_network = harbor_fields.network_mode(reader, verifier, f"{where} verifier")
    overrides = dataclasses.replace(
        defaults,
        agent_timeout_sec=reader.number(agent, "timeout_sec", f"{where} agent", defaults.agent_timeout_sec),
        agent_user=reader.string(agent, "user", f"{where} agent") or defaults.agent_user,
        verifier_timeout_sec=reader.number(verifier, "timeout_sec", f"{where} verifier",
                                           defaults.verifier_timeout_sec),
        verifier_env={**defaults.verifier_env, **reader.str_dict(verifier, "env", f"{where} verifier")},
        verifier_user=reader.string(verifier, "user", f"{where} verifier") or defaults.verifier_user,
        verifier_mode=harbor_fields.verifier_mode(reader, verifier, f"{where} verifier") or defaults.verifier_mode,
        tests_network=defaults.tests_network if tests_network is None else tests_network,
        collect=defaults.collect + harbor_fields.collect_hooks(reader, verifier, f"{where} verifier"),
    )
    min_reward = table.get("min_reward")
    if min_reward is not None and (isinstance(min_reward, bool) or not isinstance(min_reward, int | float)):
        raise reader.error(where, f"min_reward must be a number, got {_describe(min_reward)}")
    step_dir = task_dir / "steps" / name
    if not step_dir.is_dir():
        raise TaskFormatError(f"{task_dir}: step {name!r} has no folder steps/{name}/")
    tests_dirs = tuple(d for d in (task_dir / "tests", step_dir / "tests") if d.is_dir())
    if not any((d / "test.sh").is_file() for d in tests_dirs):
        raise TaskFormatError(f"{task_dir}: step {name!r} has no test.sh (in tests/ or steps/{name}/tests/)")
    setup = _step_setup(task_dir, step_dir, name)
    step = _step(reader, f"{where} verifier", name, _read_text(step_dir / "instruction.md", task_dir), tests_dirs,
                 _solution_dir(step_dir), setup, overrides,
                 None if min_reward is None else float(min_reward),
                 reader.boolean(table, "contributes_to_reward", where, True))
    return dataclasses.replace(step, workdir_dir=_step_workdir(task_dir, step_dir),
                               healthcheck=_healthcheck(reader, table, where),
                               artifacts=_artifacts(reader, table, where))


def _step_setup(task_dir: Path, step_dir: Path, name: str) -> Path | None:
    """The step's setup script: ``steps/<name>/setup.sh``, or ``steps/<name>/workdir/setup.sh`` where Harbor 0.25
    keeps it (it is uploaded with the other workdir files, and also run, as root, from a copy of its own)."""
    found = [path for path in (step_dir / "setup.sh", step_dir / "workdir" / "setup.sh") if path.is_file()]
    if len(found) > 1:
        raise TaskFormatError(f"{task_dir}: step {name!r} has two setup scripts, steps/{name}/setup.sh and "
                              f"steps/{name}/workdir/setup.sh; keep one")
    if not found:
        return None
    check_inside(found[0], task_dir.resolve())
    return found[0]


def _step(reader: _Reader, where: str, name: str, instruction: str, tests_dirs: tuple[Path, ...],
          solution_dir: Path | None, setup_script: Path | None, settings: _StepDefaults, min_reward: float | None,
          contributes: bool) -> Step:
    tests_machine = harbor_fields.verifier_machine(reader, where, tests_dirs, settings.verifier_mode,
                                                   settings.tests_network, settings.machine_network,
                                                   settings.baseline_network)
    return Step(name=name, instruction=instruction, tests_dirs=tests_dirs, solution_dir=solution_dir,
                setup_script=setup_script, agent_timeout_sec=settings.agent_timeout_sec,
                agent_user=settings.agent_user, verifier_timeout_sec=settings.verifier_timeout_sec,
                verifier_env=dict(settings.verifier_env), verifier_user=settings.verifier_user,
                min_reward=min_reward, contributes_to_reward=contributes, collect=settings.collect,
                tests_machine=tests_machine)


def _step_workdir(task_dir: Path, step_dir: Path) -> Path | None:
    """``steps/<name>/workdir/`` when the step has one; every file in it must stay inside the task folder."""
    folder = step_dir / STEP_WORKDIR
    if not folder.exists() and not folder.is_symlink():
        return None
    if not folder.is_dir():
        raise TaskFormatError(f"{folder}: must be a folder (its files are uploaded into the work directory)")
    boundary = task_dir.resolve()
    check_inside(folder, boundary)
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for name in dirnames:
            if (base / name).is_symlink():
                raise TaskFormatError(f"{base / name}: symlinked folders are not supported in a task")
        for name in filenames:
            if not check_inside(base / name, boundary).is_file():
                raise TaskFormatError(f"{base / name}: not a regular file")
    return folder


def _table_or_empty(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _seconds(reader: _Reader, table: dict[str, Any], key: str, where: str, default: float) -> float:
    """A finite number of seconds in [0, 3600]."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
        raise reader.error(where, f"{key} must be a number of seconds from 0 to 3600, got {_describe(value)}")
    return float(value)


def _healthcheck(reader: _Reader, parent: dict[str, Any], where: str) -> Healthcheck | None:
    """``healthcheck = {command = "...", interval_sec, timeout_sec, retries, start_period_sec}``, or None."""
    if "healthcheck" not in parent:
        return None
    where = f"{where} healthcheck"
    table = reader.table(parent, "healthcheck", where, _HEALTHCHECK_KEYS)
    command = reader.string(table, "command", where)
    if command is None or not command.strip():
        raise reader.error(where, "needs a command: a shell command that exits 0 once the environment is ready")
    timeout = _seconds(reader, table, "timeout_sec", where, HEALTHCHECK_TIMEOUT_SEC)
    if timeout <= 0:
        raise reader.error(where, f"timeout_sec must be above 0, got {timeout:g}")
    retries = reader.integer(table, "retries", where, HEALTHCHECK_RETRIES, minimum=0)
    if retries > 100:
        raise reader.error(where, f"retries must be at most 100, got {retries}")
    return Healthcheck(command=command, interval_sec=_seconds(reader, table, "interval_sec", where,
                                                              HEALTHCHECK_INTERVAL_SEC),
                       timeout_sec=timeout, retries=retries,
                       start_period_sec=_seconds(reader, table, "start_period_sec", where,
                                                 HEALTHCHECK_START_PERIOD_SEC))


def _artifacts(reader: _Reader, parent: dict[str, Any], where: str) -> tuple[Artifact, ...]:
    """``artifacts = ["/app/out", {source = "/app/log", destination = "logs/app"}]``: absolute sources."""
    raw = parent.get("artifacts", [])
    if not isinstance(raw, list):
        raise reader.error(where, f"artifacts must be a list of paths or {{source, destination}} tables, "
                                  f"got {_describe(raw)}")
    if len(raw) > MAX_ARTIFACTS:
        raise reader.error(where, f"artifacts lists {len(raw)} paths; at most {MAX_ARTIFACTS} are allowed")
    found = []
    for index, entry in enumerate(raw):
        at = f"{where} artifacts[{index}]"
        if isinstance(entry, str):
            source, destination = entry, None
        elif isinstance(entry, dict):
            reader.check_keys(entry, _ARTIFACT_KEYS, at)
            source, destination = reader.string(entry, "source", at), reader.string(entry, "destination", at)
            if source is None:
                raise reader.error(at, "needs a source (an absolute path in the machine)")
        else:
            raise reader.error(at, f"must be a path or a {{source, destination}} table, got {_describe(entry)}")
        if not source.startswith("/") or "\0" in source or ".." in source.split("/"):
            raise reader.error(at, f"source must be an absolute path without '..' parts, got {source!r}")
        source = posixpath.normpath(source)
        if source in ("/", "//"):
            raise reader.error(at, "source must name a file or folder, not /")
        destination = source.lstrip("/") if destination is None else destination
        parts = destination.split("/")
        if destination.startswith("/") or "\0" in destination or any(part in ("..", ".") for part in parts):
            raise reader.error(at, f"destination must be a relative path without '.' or '..' parts, "
                                   f"got {destination!r}")
        found.append(Artifact(source, posixpath.normpath(destination)))
    return tuple(found)


def _environment_variables(reader: _Reader, env: dict[str, Any]) -> dict[str, str]:
    """``[environment] env``: variable names as a shell takes them, values verbatim."""
    variables = reader.str_dict(env, "env", "[environment]")
    for name, value in variables.items():
        if not _ENV_NAME_RE.fullmatch(name):
            raise reader.error("[environment]", f"env.{name} is not a variable name (letters, digits, '_')")
        if "\0" in value:
            raise reader.error("[environment]", f"env.{name} holds a NUL character")
    return variables


def _reward_weights(reader: _Reader, metadata: dict[str, Any]) -> dict[str, float] | None:
    """``[metadata.skyrl] reward_weights``: finite weights >= 0, at least one above 0; None when absent."""
    skyrl = reader.table(metadata, "skyrl", "[metadata.skyrl]")
    if "reward_weights" not in skyrl:
        return None
    weights = skyrl["reward_weights"]
    problem = weights_problem(weights)
    if problem:
        raise reader.error("[metadata.skyrl]", f"reward_weights {problem}")
    return {key: float(value) for key, value in weights.items()}


def _test_helpers(reader: _Reader, metadata: dict[str, Any]) -> tuple[str, ...]:
    """``[metadata.skyrl] test_helpers``: names of files in :data:`TEST_HELPERS_DIR`, each once."""
    skyrl = reader.table(metadata, "skyrl", "[metadata.skyrl]")
    names = reader.str_list(skyrl, "test_helpers", "[metadata.skyrl]")
    available = sorted(path.name for path in TEST_HELPERS_DIR.iterdir()
                       if path.is_file() and not path.is_symlink() and not path.name.startswith("."))
    for name in names:
        if name not in available:
            raise reader.error("[metadata.skyrl]", f"test_helpers names {name!r}, which is not a test helper of "
                                                   f"skyrl-harbor-terminal (there are: {', '.join(available)})")
    if len(set(names)) != len(names):
        raise reader.error("[metadata.skyrl]", f"test_helpers names a helper twice: {names}")
    return tuple(names)


def _solution_dir(folder: Path) -> Path | None:
    solution = folder / "solution"
    return solution if (solution / "solve.sh").is_file() else None
