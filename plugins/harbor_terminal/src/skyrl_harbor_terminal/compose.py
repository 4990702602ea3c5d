"""A task's ``environment/docker-compose.yaml``: the services beside the agent's machine, checked at load.

Harbor merges this file with its own, in which the agent's container is the service ``main``
(built from ``environment/Dockerfile``). Here the other services become sidecars of the machine
(see :mod:`skyrl_sandbox.sidecars`): they share its loopback-only network namespace and are reached
by service name or on localhost. A subset of compose is supported, and anything outside it is an
error naming the file, the service and the key, never ignored:

- top level: ``services`` (plus ``version``, ``name``, ``x-*``);
- a service: ``build`` (a context path, or ``{context, dockerfile, args}``), ``image`` (on the
  engine already: nothing is pulled), ``environment``, ``command``, ``entrypoint``,
  ``healthcheck``, ``depends_on``, ``working_dir``, ``user``, ``expose`` (accepted, meaningless);
- ``main``: ``environment`` (added to every command's), ``depends_on`` (waited for before the
  agent's first command), ``healthcheck`` (checked, no effect: nothing may wait for main's health),
  ``expose``, and ``build``/``image`` in place of ``environment/Dockerfile``.

Values are interpolated as compose does, except that nothing comes from this machine's environment:
``$$`` is a ``$``, ``${NAME:-default}`` and ``${NAME-default}`` are the default, and any other
variable is an error.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from skyrl_sandbox.sidecars import CONDITIONS, MACHINE_NAME, Healthcheck, SidecarSpec, start_order

from .task_errors import TaskFormatError

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml")
_TOP_KEYS = {"services", "version", "name"}
_SERVICE_KEYS = {"build", "image", "environment", "command", "entrypoint", "healthcheck", "depends_on", "working_dir",
                 "user", "expose"}
_MAIN_KEYS = {"build", "image", "environment", "depends_on", "healthcheck", "expose"}
_BUILD_KEYS = {"context", "dockerfile", "args"}
_HEALTH_KEYS = {"test", "interval", "timeout", "retries", "start_period", "disable"}
_DEPENDENCY_KEYS = {"condition", "required", "restart"}
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_VARIABLE_RE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)|(?P<lone>))")
_DEFAULT_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])(?P<rest>.*)", re.DOTALL)
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_UNPRIVILEGED = "services run unprivileged, with the agent machine's hardening (no devices, capabilities or namespaces)"
_NETWORK = ("every service shares the agent machine's network namespace, which has loopback only: services "
            "reach each other by name (http://<service>:<port>) or on localhost; there are no networks to set up")
_RESOURCES = "each service gets the task's [environment] cpus and memory, as the agent's machine does"
_FILES = "put the files into the service's image (COPY in its Dockerfile)"
_HINTS = {
    "ports": "services reach each other by name (e.g. http://api-server:8000) or on localhost, and nothing is "
             "published to the host, so there is nothing to map: remove ports (expose is accepted)",
    "volumes": f"there are no volumes or bind mounts: {_FILES}", "volumes_from": f"there are no volumes: {_FILES}",
    "tmpfs": f"there are no extra mounts: {_FILES}", "secrets": f"there are no secrets: {_FILES}",
    "configs": f"there are no configs: {_FILES}", "env_file": "write the variables under environment",
    "networks": _NETWORK, "network_mode": _NETWORK, "links": _NETWORK, "external_links": _NETWORK,
    "extra_hosts": _NETWORK, "dns": _NETWORK, "dns_search": _NETWORK, "hostname": _NETWORK, "domainname": _NETWORK,
    "mac_address": _NETWORK, "container_name": "a service is reached by its service name; remove container_name",
    "privileged": _UNPRIVILEGED, "cap_add": _UNPRIVILEGED, "cap_drop": _UNPRIVILEGED, "devices": _UNPRIVILEGED,
    "security_opt": _UNPRIVILEGED, "pid": _UNPRIVILEGED, "ipc": _UNPRIVILEGED, "userns_mode": _UNPRIVILEGED,
    "cgroup_parent": _UNPRIVILEGED, "sysctls": _UNPRIVILEGED, "gpus": "GPUs are not provided to task containers",
    "deploy": _RESOURCES, "mem_limit": _RESOURCES, "memswap_limit": _RESOURCES, "cpus": _RESOURCES,
    "cpu_count": _RESOURCES, "cpu_shares": _RESOURCES, "pids_limit": _RESOURCES, "ulimits": _RESOURCES,
    "shm_size": _RESOURCES, "restart": "services are never restarted: one that exits with an error fails the start",
    "profiles": "every service of the file runs; profiles are not supported",
    "extends": "write the service out in full (extends is not supported)",
    "platform": "images are built on this machine, for its platform",
    "pull_policy": "nothing is ever pulled: images are built here or must be on the engine",
    "include": "put every service into this one file",
}
_MAIN_HINTS = {
    "command": "the agent's machine runs no program of its own: its shell is the agent's",
    "entrypoint": "the agent's machine runs no program of its own: its shell is the agent's",
    "working_dir": "set the agent's folder with task.toml [environment] workdir or WORKDIR in environment/Dockerfile",
    "user": "set the agent's user with task.toml [agent] user",
}


@dataclass(frozen=True)
class BuildSpec:
    """How to build a service's image: a context folder inside the task folder and its Dockerfile."""

    context: Path
    dockerfile: str  # relative to context
    args: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceSpec:
    """One compose service as it will run (every value checked and interpolated)."""

    name: str
    build: BuildSpec | None = None
    image: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, str] = field(default_factory=dict)  # service -> condition
    working_dir: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class ComposeSpec:
    """The task's compose file: what it adds to ``main``, and its other services in start order."""

    path: Path
    main: ServiceSpec  # empty when the file does not name main
    services: tuple[ServiceSpec, ...]

    @property
    def service_names(self) -> tuple[str, ...]:
        return tuple(service.name for service in self.services)

    def main_source(self, docker_image: str | None) -> tuple[Path | None, str, str | None] | None:
        """(context, Dockerfile, prebuilt image) of the agent's machine when main's ``build``/``image`` replaces
        ``environment/Dockerfile`` (and task.toml's ``docker_image``); else None."""
        if self.main.build is not None:
            return self.main.build.context, self.main.build.dockerfile, docker_image
        if self.main.image is not None:
            return None, "Dockerfile", self.main.image
        return None

    def sidecars(self, images: dict[str, str], *, cpus: float, memory_mb: int, max_processes: int
                 ) -> tuple[SidecarSpec, ...]:
        """The services as sidecars of a machine, given each one's image tag on the engine."""
        sidecars = []
        for service in self.services:
            check = service.healthcheck
            ready = 120.0 if check is None or check.disabled else min(max(120.0, check.longest_wait_s()), 900.0)
            sidecars.append(SidecarSpec(
                name=service.name, image=images[service.name], command=service.command,
                entrypoint=service.entrypoint, env=dict(service.environment), working_dir=service.working_dir,
                user=service.user, healthcheck=check,
                depends_on={name: condition for name, condition in service.depends_on.items() if name != MACHINE_NAME},
                cpus=cpus, memory_mb=memory_mb, max_processes=max_processes, ready_timeout_s=ready))
        return tuple(sidecars)


def find_compose_file(task_dir: Path) -> Path | None:
    """``environment/docker-compose.yaml`` (or ``.yml``); an error when both exist."""
    found = [task_dir / "environment" / name for name in COMPOSE_FILES if (task_dir / "environment" / name).is_file()]
    if len(found) > 1:
        _fail(f"{task_dir / 'environment'}: both docker-compose.yaml and docker-compose.yml exist; keep one")
    return found[0] if found else None


def load_compose(task_dir: Path) -> ComposeSpec | None:
    """The task's compose file read and checked (TaskFormatError naming the file and key), or None without one."""
    path = find_compose_file(task_dir)
    if path is None:
        return None
    return _Parser(path, task_dir.resolve()).parse()


class _Parser:
    def __init__(self, path: Path, task_root: Path) -> None:
        self.path = path
        self.task_root = task_root

    def fail(self, where: str, message: str) -> NoReturn:
        _fail(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def unsupported(self, where: str, why: str) -> NoReturn:
        _fail(f"{self.path}: {where} is not supported: {why}")

    def parse(self) -> ComposeSpec:
        try:
            document = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            self.fail("", f"not valid YAML: {exc}")
        if not isinstance(document, dict):
            self.fail("", f"must be a mapping with a services key, got {_describe(document)}")
        for key in document:
            if not isinstance(key, str) or (key not in _TOP_KEYS and not key.startswith("x-")):
                hint = _HINTS.get(key, f"supported: {', '.join(sorted(_TOP_KEYS))} and x-* extensions")
                self.unsupported(f"top-level key {key!r}", hint)
        raw_services = document.get("services")
        if not isinstance(raw_services, dict) or not raw_services:
            self.fail("services", f"must map service names to their settings, got {_describe(raw_services)}")
        services = {name: self.service(name, raw) for name, raw in raw_services.items()}
        main = services.pop(MACHINE_NAME, ServiceSpec(MACHINE_NAME))
        return ComposeSpec(self.path, main, self.ordered(main, services))

    def service(self, name: Any, raw: Any) -> ServiceSpec:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            self.fail(f"services.{name}", "a service name must be a host name: lower-case letters, digits, '.', '_' "
                                          "and '-', starting with a letter or digit, at most 63")
        where = f"services.{name}"
        if not isinstance(raw, dict):
            self.fail(where, f"must be a mapping of settings, got {_describe(raw)}")
        raw = {key: value for key, value in raw.items() if not (isinstance(key, str) and key.startswith("x-"))}
        raw = self.interpolate(raw, where)
        is_main = name == MACHINE_NAME
        allowed = _MAIN_KEYS if is_main else _SERVICE_KEYS
        for key in raw:
            if key not in allowed:
                keys = ", ".join(sorted(allowed))
                hint = (_MAIN_HINTS.get(key) if is_main else None) or _HINTS.get(key) or (
                    f"main (the agent's machine) takes {keys}" if is_main else f"supported keys are {keys}")
                self.unsupported(f"{where}.{key}", hint)
        build = self.build(raw["build"], f"{where}.build", is_main) if "build" in raw else None
        image = self.string(raw, "image", where)
        if not is_main and build is None and image is None:
            self.fail(where, "needs a build (a folder with a Dockerfile) or an image")
        if "expose" in raw and not isinstance(raw["expose"], list):
            self.fail(f"{where}.expose", f"must be a list of ports, got {_describe(raw['expose'])}")
        working_dir = self.string(raw, "working_dir", where)
        if working_dir is not None and not working_dir.startswith("/"):
            self.fail(f"{where}.working_dir", f"must be an absolute path, got {working_dir!r}")
        return ServiceSpec(
            name=name, build=build, image=image, environment=self.environment(raw.get("environment"), where),
            command=self.argv(raw, "command", where), entrypoint=self.argv(raw, "entrypoint", where),
            healthcheck=self.healthcheck(raw["healthcheck"], f"{where}.healthcheck") if "healthcheck" in raw else None,
            depends_on=self.depends_on(raw.get("depends_on"), f"{where}.depends_on", name), working_dir=working_dir,
            user=self.string(raw, "user", where, allow_number=True))

    # -- values -------------------------------------------------------------------------------------

    def interpolate(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            return _VARIABLE_RE.sub(lambda match: self.variable(match, where), value)
        if isinstance(value, dict):
            return {key: self.interpolate(item, f"{where}.{key}") for key, item in value.items()}
        if isinstance(value, list):
            return [self.interpolate(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return value

    def variable(self, match: re.Match[str], where: str) -> str:
        if match.group("escaped"):
            return "$"
        braced = match.group("braced")
        if braced is not None:
            default = _DEFAULT_RE.fullmatch(braced)
            if default and default.group("op") in ("-", ":-"):
                return default.group("rest")
            name = default.group("name") if default else braced
        else:
            name = match.group("bare")
        if not name:
            self.fail(where, "a lone '$' is not a variable; write '$$' for a literal '$'")
        self.fail(where, f"${{{name}}} is not filled in: nothing is taken from this machine's environment; give "
                         f"it a default (${{{name}:-value}}), write the value, or '$$' for a literal '$'")

    def string(self, raw: dict[str, Any], key: str, where: str, allow_number: bool = False) -> str | None:
        value = raw.get(key)
        if allow_number and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if value is not None and (not isinstance(value, str) or not value):
            self.fail(f"{where}.{key}", f"must be a non-empty string, got {_describe(value)}")
        return value

    def argv(self, raw: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                self.fail(f"{where}.{key}", f"cannot be split into words: {exc}")
        if isinstance(value, list) and all(isinstance(item, str | int | float) and not isinstance(item, bool)
                                           for item in value):
            return tuple(str(item) for item in value)
        self.fail(f"{where}.{key}", f"must be a string or a list of strings, got {_describe(value)}")

    def environment(self, value: Any, where: str, key: str = "environment") -> dict[str, str]:
        where = f"{where}.{key}"
        if value is None:
            return {}
        pairs: list[tuple[Any, Any]] = []
        if isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, list):
            for item in value:
                if not isinstance(item, str):
                    self.fail(where, f"each item must be a 'NAME=value' string, got {_describe(item)}")
                name, equals, text = item.partition("=")
                pairs.append((name, text if equals else None))
        else:
            self.fail(where, f"must be a mapping or a list of 'NAME=value', got {_describe(value)}")
        environment: dict[str, str] = {}
        for name, item in pairs:
            if not isinstance(name, str) or not name or "=" in name:
                self.fail(where, f"{name!r} is not a variable name")
            if item is None:
                self.fail(f"{where}.{name}", "has no value: values are never taken from this machine's "
                                             "environment; write one (an empty one is NAME=)")
            if isinstance(item, dict | list):
                self.fail(f"{where}.{name}", f"must be a string, number or boolean, got {_describe(item)}")
            environment[name] = str(item).lower() if isinstance(item, bool) else str(item)
        return environment

    def build(self, value: Any, where: str, is_main: bool) -> BuildSpec:
        if isinstance(value, str):
            value = {"context": value}
        if not isinstance(value, dict):
            self.fail(where, f"must be a context path or a mapping of {', '.join(sorted(_BUILD_KEYS))}, got "
                             f"{_describe(value)}")
        for key in value:
            if key not in _BUILD_KEYS:
                self.unsupported(f"{where}.{key}", f"build takes {', '.join(sorted(_BUILD_KEYS))}")
        context_text = self.string(value, "context", where) or "."
        dockerfile = self.string(value, "dockerfile", where) or "Dockerfile"
        context = (self.path.parent / context_text).resolve()
        boundary = self.path.parent.resolve() if is_main else self.task_root
        if not context.is_relative_to(boundary):
            inside = "environment/ (the agent's image must not hold the tests or the solution)" if is_main else \
                "the task folder"
            self.fail(f"{where}.context", f"{context_text!r} leads out of {inside}: {context}")
        if not context.is_dir():
            self.fail(f"{where}.context", f"{context_text!r} is not a folder ({context})")
        recipe = (context / dockerfile).resolve()
        if not recipe.is_relative_to(context):
            self.fail(f"{where}.dockerfile", f"{dockerfile!r} must be inside the build context {context}")
        if not recipe.is_file():
            self.fail(f"{where}.dockerfile", f"{recipe} does not exist")
        args = self.environment(value.get("args"), where, "args")
        if args and is_main:
            self.fail(f"{where}.args", "build args are supported for the other services only; write the values "
                                       "into main's Dockerfile (ARG NAME=value)")
        return BuildSpec(context, recipe.relative_to(context).as_posix(), args)

    def healthcheck(self, value: Any, where: str) -> Healthcheck:
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {_describe(value)}")
        for key in value:
            if key not in _HEALTH_KEYS:
                extra = " (start_interval needs a newer Docker Engine than this one supports)" \
                    if key == "start_interval" else ""
                self.unsupported(f"{where}.{key}", f"a healthcheck takes {', '.join(sorted(_HEALTH_KEYS))}{extra}")
        disable = value.get("disable", False)
        if not isinstance(disable, bool):
            self.fail(f"{where}.disable", f"must be true or false, got {_describe(disable)}")
        test = value.get("test")
        if disable:
            if test not in (None, ["NONE"], "NONE"):
                self.fail(where, "has both disable: true and a test; keep one")
            return Healthcheck(("NONE",))
        if test is None:
            argv: tuple[str, ...] = ()
        elif isinstance(test, str):
            argv = ("CMD-SHELL", test)
        elif isinstance(test, list) and test and all(isinstance(item, str) for item in test):
            argv = tuple(test)
            if argv[0] not in ("CMD", "CMD-SHELL", "NONE") or (argv[0] == "CMD-SHELL" and len(argv) != 2) or \
                    (argv[0] == "CMD" and len(argv) < 2) or (argv[0] == "NONE" and len(argv) != 1):
                self.fail(f"{where}.test", f"a list must be [CMD, program, args...], [CMD-SHELL, \"command\"] or "
                                           f"[NONE], got {test!r}")
        else:
            self.fail(f"{where}.test", f"must be a shell command or a [CMD, ...] list, got {_describe(test)}")
        retries = value.get("retries", 0)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            self.fail(f"{where}.retries", f"must be a whole number >= 0, got {_describe(retries)}")
        return Healthcheck(argv, interval_s=self.duration(value, "interval", where),
                           timeout_s=self.duration(value, "timeout", where), retries=retries,
                           start_period_s=self.duration(value, "start_period", where))

    def duration(self, raw: dict[str, Any], key: str, where: str) -> float:
        value = raw.get(key)
        if value is None:
            return 0.0
        text = value.strip() if isinstance(value, str) else ""
        parts = _DURATION_RE.findall(text)
        if not text or "".join(number + unit for number, unit in parts) != text:
            self.fail(f"{where}.{key}", f"must be a duration such as \"5s\", \"1m30s\" or \"250ms\", got "
                                        f"{_describe(value)}")
        seconds = sum(float(number) * _SECONDS[unit] for number, unit in parts)
        if 0 < seconds < 0.001:
            self.fail(f"{where}.{key}", f"must be at least 1ms, got {value!r}")
        return seconds

    def depends_on(self, value: Any, where: str, owner: str) -> dict[str, str]:
        if value is None:
            return {}
        if isinstance(value, list):
            if not all(isinstance(item, str) for item in value):
                self.fail(where, f"a list must name services, got {value!r}")
            return {item: "service_started" for item in value}
        if not isinstance(value, dict):
            self.fail(where, f"must be a list of services or a mapping of service: {{condition: ...}}, got "
                             f"{_describe(value)}")
        dependencies: dict[str, str] = {}
        for name, settings in value.items():
            settings = settings if settings is not None else {}
            if not isinstance(settings, dict):
                self.fail(f"{where}.{name}", f"must be a mapping such as {{condition: service_healthy}}, got "
                                             f"{_describe(settings)}")
            for key in settings:
                if key not in _DEPENDENCY_KEYS:
                    self.unsupported(f"{where}.{name}.{key}", "a dependency takes condition, required and restart")
            if settings.get("required", True) is not True:
                self.fail(f"{where}.{name}.required", "optional dependencies are not supported: every service runs")
            if not isinstance(settings.get("restart", False), bool):
                self.fail(f"{where}.{name}.restart", f"must be true or false, got {_describe(settings['restart'])}")
            condition = settings.get("condition", "service_started")
            if condition not in CONDITIONS:
                self.fail(f"{where}.{name}.condition", f"must be one of {', '.join(CONDITIONS)}, got "
                                                       f"{_describe(condition)}")
            dependencies[str(name)] = condition
        if owner in dependencies:
            self.fail(where, f"{owner} cannot depend on itself")
        return dependencies

    # -- the services together ------------------------------------------------------------------------

    def ordered(self, main: ServiceSpec, services: dict[str, ServiceSpec]) -> tuple[ServiceSpec, ...]:
        known = ", ".join(services) or "none besides main"
        for service in (main, *services.values()):
            where = f"services.{service.name}.depends_on"
            for name, condition in service.depends_on.items():
                if name == MACHINE_NAME and condition != "service_started":
                    self.fail(f"{where}.{name}", f"main is the agent's machine: it starts first and runs no service "
                                                 f"of its own, so it is never {condition.removeprefix('service_')}")
                elif name != MACHINE_NAME and name not in services:
                    self.fail(where, f"names {name!r}, which is not a service of this file ({known})")
        placeholders = [SidecarSpec(service.name, "-", depends_on={
            name: condition for name, condition in service.depends_on.items() if name != MACHINE_NAME})
            for service in services.values()]
        try:
            order = start_order(placeholders, main.depends_on)
        except ValueError as exc:
            self.fail("services", str(exc).replace("sidecars", "services"))
        return tuple(services[sidecar.name] for sidecar in order)


def _fail(message: str) -> NoReturn:
    raise TaskFormatError(message)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"
