"""Finding OpenEnv envs: installed OpenEnv env packages (as ``openenv.auto`` finds them), ``module:Class``, ``demo``.

:func:`resolve` turns ``env.name`` (and ``env.action``) into a :class:`Target`: the ``Environment`` class, its
``Action`` and ``Observation`` classes, and the dotted paths a server subprocess imports them by.
"""

from __future__ import annotations

import importlib
import inspect
import math
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from skyrl_core.catalog import CatalogEntry

from skyrl_bridge_openenv._peer import load_openenv_core

load_openenv_core()  # openenv.core without its web UI's import time

ALIASES = {"demo": "skyrl_bridge_openenv.demo:SumEnvironment"}


class OpenEnvBridgeError(ValueError):
    """env.name / env.action do not name a usable OpenEnv env; the message says what to give instead."""


@dataclass(frozen=True)
class Target:
    label: str  # what env.name said
    env_cls: type | None  # None: a server at a URL whose env is not importable here
    action_cls: type
    observation_cls: type | None

    @property
    def env_path(self) -> str:
        return _path(self.env_cls)

    @property
    def action_path(self) -> str:
        return _path(self.action_cls)

    @property
    def observation_path(self) -> str:
        from openenv.core.env_server.types import Observation

        return _path(self.observation_cls or Observation)

    def declared_range(self) -> tuple[float, float] | None:
        """The ``reward_range`` class attribute of the env, when it declares a valid one."""
        value = getattr(self.env_cls, "reward_range", None)
        try:
            low, high = (float(v) for v in value)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            return None
        return (low, high) if math.isfinite(low) and math.isfinite(high) and low < high else None


def _path(cls: type | None) -> str:
    assert cls is not None
    return f"{cls.__module__}:{cls.__qualname__}"


def import_path(path: str, what: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise OpenEnvBridgeError(f"{what} {path!r}: expected 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OpenEnvBridgeError(f"{what} {path!r}: cannot import module {module_name!r}: {exc}") from exc
    value: Any = module
    for part in attr.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise OpenEnvBridgeError(f"{what} {path!r}: module {module_name!r} has no {attr!r}")
    return value


def installed_envs() -> dict[str, Any]:
    """OpenEnv env packages installed here (``openenv-*`` distributions), by env key, as ``openenv.auto`` sees them.

    Read fresh every call (openenv's own cache file in the temp folder is neither read nor written).
    """
    from openenv.auto._discovery import EnvironmentDiscovery

    return EnvironmentDiscovery()._discover_installed_packages()


def entries() -> list[CatalogEntry]:
    """``demo`` and every installed OpenEnv env package; any ``module:EnvironmentClass`` works too."""
    listed = [CatalogEntry("demo", "One step: add two numbers, reply {\"answer\": N} (shipped with the bridge).",
                           multi_turn=False, reward_range=(0.0, 1.0), tags=("builtin",))]
    for key, info in sorted(installed_envs().items()):
        listed.append(CatalogEntry(key, f"{info.description} ({info.package_name} {info.version})",
                                   multi_turn=True, tags=("installed", info.package_name)))
    return listed


def resolve(name: str, action: str | None = None, *, remote_ok: bool = False) -> Target | None:
    """The Target ``name`` names; ``None`` when ``remote_ok`` and ``name`` is not importable here (mode 'url')."""
    from openenv.core.env_server.interfaces import Environment

    path = ALIASES.get(name, name)
    if ":" in path:
        env_cls = import_path(path, "env.name")
    else:
        env_cls = _installed_env_class(path, quiet=remote_ok)
        if env_cls is None:
            return None
    if not (inspect.isclass(env_cls) and issubclass(env_cls, Environment)):
        raise OpenEnvBridgeError(f"env.name {name!r} is {env_cls!r}, not a subclass of OpenEnv's "
                                 "openenv.core.env_server.interfaces.Environment")
    action_cls, observation_cls = _generic_types(env_cls)
    if action_cls is None and ":" not in path:  # an installed env: the action class its manifest names
        info = installed_envs().get(_env_key(path))
        try:
            action_cls = info.get_action_class() if info is not None else None
        except ImportError:
            action_cls = None
    if action is not None:
        action_cls = import_path(action, "env.action")
    _check_action_cls(action_cls, name)
    return Target(name, env_cls, action_cls, observation_cls)


def _check_action_cls(action_cls: Any, name: str) -> None:
    from openenv.core.env_server.types import Action

    if action_cls is None:
        raise OpenEnvBridgeError(
            f"cannot tell the action class of OpenEnv env {name!r} from its type hints (Environment[Action, "
            f"Observation, State] or step(action: ...)); give it as env.action=module:ActionClass")
    if not (inspect.isclass(action_cls) and issubclass(action_cls, Action)):
        raise OpenEnvBridgeError(f"the action class of {name!r}, {action_cls!r}, is not a subclass of OpenEnv's Action")


def _generic_types(env_cls: type) -> tuple[type | None, type | None]:
    """(Action, Observation) classes from ``Environment[A, O, S]`` in the class's bases, else step()'s hints."""
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            args = typing.get_args(base)
            if origin is not None and inspect.isclass(origin) and issubclass(origin, Environment) and len(args) >= 2:
                act, obs = args[0], args[1]
                if inspect.isclass(act) and issubclass(act, Action):
                    return act, obs if inspect.isclass(obs) and issubclass(obs, Observation) else None
    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to env.action
        hints = {}
    act, obs = hints.get("action"), hints.get("return")
    act = act if inspect.isclass(act) and issubclass(act, Action) else None
    obs = obs if inspect.isclass(obs) and issubclass(obs, Observation) else None
    return act, obs


def _env_key(name: str) -> str:
    from openenv.auto._discovery import _normalize_env_name

    return _normalize_env_name(name).removesuffix("_env")


@lru_cache(maxsize=64)
def _installed_env_class(name: str, quiet: bool = False) -> type | None:
    """The Environment class of installed OpenEnv env ``name`` (``echo``, ``echo_env``, ``echo-env``)."""
    from openenv.core.env_server.interfaces import Environment

    envs = installed_envs()
    info = envs.get(_env_key(name)) or envs.get(name)
    if info is None:
        if quiet:
            return None
        known = ", ".join(sorted(envs)) or "none installed"
        raise OpenEnvBridgeError(
            f"no OpenEnv env {name!r}: give an installed OpenEnv env package's name (installed: {known}), 'demo', "
            f"or 'module:EnvironmentClass'. Nothing is downloaded: install the env's package (pip install "
            f"openenv-<name>) to use it by name")
    module = info.client_module_path.rsplit(".", 1)[0]
    try:
        server = importlib.import_module(f"{module}.server")
    except ImportError as exc:
        raise OpenEnvBridgeError(f"OpenEnv env {name!r} ({info.package_name}) has no importable server package "
                                 f"{module}.server holding its Environment: {exc}") from exc
    found = [value for value in vars(server).values() if inspect.isclass(value) and issubclass(value, Environment)
             and value is not Environment and value.__module__.startswith(module)]
    if not found:
        raise OpenEnvBridgeError(f"OpenEnv env {name!r} ({info.package_name}): {module}.server exports no Environment "
                                 "subclass; name it as env.name=module:EnvironmentClass")
    preferred = [cls for cls in found if cls.__name__ == info.client_class_name.removesuffix("Env") + "Environment"]
    return (preferred or found)[0]
