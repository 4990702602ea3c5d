"""Build registered components from their ids and config dicts, with errors that name the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from skyrl_core.env import EnvConfig, TextEnv
from skyrl_core.plugins import get_registry
from skyrl_core.protocols import Generator, Trainer
from skyrl_core.registry import Kind, Registry, RegistryError, did_you_mean

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value is unknown, missing or invalid; the message names the key."""


def validate_config(model: type[BaseModel], values: Mapping[str, Any], section: str) -> BaseModel:
    """Instantiate ``model`` from ``values``; errors name ``section.key`` and the allowed keys."""
    try:
        return model(**dict(values))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, section)) from None


def format_validation_error(exc: ValidationError, model: type[BaseModel], section: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in (section, *err["loc"]) if p != "")
        owner, field = _field_at(model, err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = sorted(owner.model_fields)
            name = str(err["loc"][-1])
            lines.append(f"{key}: unknown key.{did_you_mean(name, allowed)} Allowed keys: {', '.join(allowed)}")
        else:
            meaning = f" ({field.description})" if field is not None and field.description else ""
            lines.append(f"{key}: {err['msg']}, got {err.get('input')!r}{meaning}")
    return "invalid config:\n  " + "\n  ".join(lines)


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[type[BaseModel], Any]:
    """The model that owns the last key of ``loc`` (following nested config models) and its field."""
    owner, field = model, None
    for depth, part in enumerate(loc):
        field = owner.model_fields.get(str(part))
        if field is None:
            break
        nested = field.annotation
        if depth < len(loc) - 1 and isinstance(nested, type) and issubclass(nested, BaseModel):
            owner = nested
    return owner, field


def component_config(kind: Kind, id: str, values: Mapping[str, Any] | None = None,
                     registry: Registry | None = None) -> BaseModel | None:
    """The validated config object for component ``id`` (``None`` if it declares no config class)."""
    spec = (registry or get_registry()).get(kind, id)
    model = spec.config_class()
    if model is None and kind == "env":
        model = env_class(id, registry).config_class
    if model is None:
        if values:
            raise ConfigError(f"{kind} {id!r} takes no options, got {sorted(values)}")
        return None
    return validate_config(model, values or {}, kind)


def config_fields(kind: Kind, id: str, registry: Registry | None = None) -> set[str]:
    """Option names that component ``id`` accepts (empty when it takes none)."""
    spec = (registry or get_registry()).get(kind, id)
    model = spec.config_class()
    if model is None and kind == "env":
        model = env_class(id, registry).config_class
    return set(model.model_fields) if model is not None else set()


def env_class(env_id: str, registry: Registry | None = None) -> type[TextEnv]:
    return _loaded_class("env", env_id, TextEnv, "a TextEnv subclass", registry)


def generator_class(generator_id: str, registry: Registry | None = None) -> type[Generator]:
    """The class of generator ``generator_id``, checked against the :class:`~skyrl_core.protocols.Generator`
    protocol."""
    return _loaded_class("generator", generator_id, Generator, "a Generator (generate and close)", registry)


def trainer_class(trainer_id: str, registry: Registry | None = None) -> type[Trainer]:
    """The class of trainer ``trainer_id``, checked against the :class:`~skyrl_core.protocols.Trainer` protocol."""
    return _loaded_class("trainer", trainer_id, Trainer, "a Trainer (fit)", registry)


def _loaded_class(kind: Kind, id: str, base: type[T], what: str, registry: Registry | None) -> type[T]:
    cls = (registry or get_registry()).get(kind, id).load()
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise RegistryError(f"{kind} {id!r} entry point is {cls!r}, not {what}")
    return cls


def make_env(env_id: str, task: Mapping[str, Any] | None = None,
             config: EnvConfig | Mapping[str, Any] | None = None, registry: Registry | None = None) -> TextEnv:
    """Construct env ``env_id`` for one task row."""
    cls = env_class(env_id, registry)
    if not isinstance(config, BaseModel):
        config = validate_config(cls.config_class, config or {}, "env")
    return cls(task=task, config=config)
