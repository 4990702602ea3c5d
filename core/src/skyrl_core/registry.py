"""Component specs and the registry that maps ids to them.

A plugin registers *specs*: an id, a lazy ``"module:attr"`` entry point, a description, a config
class and declared metadata. Listing only reads specs; :meth:`Registry.make` imports the entry point.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

Kind = Literal["env", "generator", "trainer", "engine"]
KINDS: tuple[Kind, ...] = ("env", "generator", "trainer", "engine")
LISTING_COMMAND = {"env": "skyrl envs", "generator": "skyrl generators", "trainer": "skyrl trainers",
                   "engine": "skyrl engines"}
_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class RegistryError(LookupError):
    """An id is unknown, duplicated or malformed, or a component failed to load."""


@dataclass(frozen=True)
class Provider:
    """The distribution (or development module) that registered a component."""

    name: str
    version: str


@dataclass(frozen=True)
class ComponentSpec:
    """What a plugin registers: enough to list and document a component without importing it.

    ``entry_point`` is ``"module:attr"``; ``config`` is a pydantic model class or a lazy
    ``"module:attr"`` path to one (``None``: the component takes no options).
    """

    kind: ClassVar[Kind]
    id: str
    entry_point: str
    description: str = ""
    config: type[BaseModel] | str | None = None
    provider: Provider | None = None

    def __post_init__(self) -> None:
        if not _ID_RE.match(self.id):
            raise RegistryError(f"{self.kind} id {self.id!r} is not lower snake case (e.g. 'rlm_repl')")
        if ":" not in self.entry_point:
            raise RegistryError(f"{self.kind} {self.id!r}: entry_point {self.entry_point!r} must be 'module:attr'")

    def load(self) -> Any:
        """Import and return the object the entry point names."""
        return _import_path(self.entry_point, f"{self.kind} {self.id!r}")

    def config_class(self) -> type[BaseModel] | None:
        if self.config is None or isinstance(self.config, type):
            return self.config
        return _import_path(self.config, f"{self.kind} {self.id!r} config")

    def metadata(self) -> dict[str, Any]:
        """Declared metadata shown by the listing commands (overridden by spec subclasses)."""
        return {}


@dataclass(frozen=True)
class EnvSpec(ComponentSpec):
    kind: ClassVar[Kind] = "env"
    max_turns: int | None = None
    reward_range: tuple[float, float] = (0.0, 1.0)
    needs_network: bool = False
    needs_docker: bool = False
    needs_gpu: bool = False
    # Generator used when a run config names none (e.g. a tree generator for recursive envs).
    default_generator: str | None = None
    # Stop strings the env's action format needs (e.g. "</sql>"); generators add them to generator.stop.
    stop: tuple[str, ...] = ()
    # Recommended options for `skyrl run` on this env, per section ({"trainer": {"lr": 2e-5}, ...}): the
    # lowest config layer, so a config file or override always wins; options a chosen component does not
    # declare are left out. Lets `skyrl run --env X --trainer T` be a sensible run with no other flags.
    run_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The held-out split of each training split ({"train": "test", "starter": "starter_test"}): what a run
    # evaluates on and what `skyrl rollout` plays by default. A training split not listed is evaluated on
    # itself, so an env with one set of tasks for every split declares {}. See skyrl_core.held_out.
    eval_splits: Mapping[str, str] = field(default_factory=lambda: {"train": "test"})
    # Options for playing the env without training (`skyrl rollout`, `skyrl eval`), over run_defaults and under
    # everything else: what differs between training on a task and measuring it (e.g. harbor_terminal plays, and
    # marks, tasks whose reward a policy could forge, which training leaves out). See skyrl_core.held_out.
    rollout_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # A bridge's catalogue: "module:attr" of a function listing the peer envs it hosts (CatalogEntry records or
    # names), chosen with env.name. `skyrl envs --catalog ID` calls it; nothing else does. See skyrl_core.catalog.
    catalog: str | None = None

    def metadata(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns, "reward_range": list(self.reward_range), "catalog": self.catalog,
                "needs_network": self.needs_network, "needs_docker": self.needs_docker,
                "needs_gpu": self.needs_gpu, "default_generator": self.default_generator,
                "stop": list(self.stop), "run_defaults": {k: dict(v) for k, v in self.run_defaults.items()},
                "eval_splits": dict(self.eval_splits),
                "rollout_defaults": {k: dict(v) for k, v in self.rollout_defaults.items()}}


@dataclass(frozen=True)
class GeneratorSpec(ComponentSpec):
    kind: ClassVar[Kind] = "generator"


@dataclass(frozen=True)
class TrainerSpec(ComponentSpec):
    kind: ClassVar[Kind] = "trainer"
    needs_gpu: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"needs_gpu": self.needs_gpu}


@dataclass(frozen=True)
class EngineSpec(ComponentSpec):
    kind: ClassVar[Kind] = "engine"
    needs_gpu: bool = False
    needs_network: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"needs_gpu": self.needs_gpu, "needs_network": self.needs_network}


@dataclass
class Registry:
    """All registered components, by kind and id.

    An id registered by two providers is a *clash*: it is listed (with both providers) but every
    lookup of it fails with a message naming both, while the other ids work as usual.
    """

    specs: dict[Kind, dict[str, ComponentSpec]] = field(default_factory=lambda: {k: {} for k in KINDS})
    # Hints for ids that no installed package provides, e.g. {"trainer": {"fsdp_grpo": "skyrl-trainers"}}.
    known_providers: dict[Kind, dict[str, str]] = field(default_factory=dict)
    # Ids registered more than once, with every spec that claims them.
    clashes: dict[Kind, dict[str, list[ComponentSpec]]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def add(self, spec: ComponentSpec, provider: Provider) -> None:
        if not isinstance(spec, ComponentSpec):
            raise RegistryError(f"register() expects an EnvSpec/GeneratorSpec/TrainerSpec/EngineSpec, "
                                f"got {type(spec).__name__} from {provider.name}")
        spec = replace(spec, provider=provider)
        clashing = self.clashes[spec.kind]
        if spec.id in clashing:
            clashing[spec.id].append(spec)
        elif spec.id in self.specs[spec.kind]:
            clashing[spec.id] = [self.specs[spec.kind].pop(spec.id), spec]
        else:
            self.specs[spec.kind][spec.id] = spec

    def clash_message(self, kind: Kind, id: str) -> str:
        providers = " and by ".join(f"{s.provider.name} {s.provider.version}"  # type: ignore[union-attr]
                                    for s in self.clashes[kind][id])
        return (f"{kind} id {id!r} is registered twice: by {providers}; uninstall one of them or disable it "
                f"with SKYRL_LOAD_PLUGINS")

    def ids(self, kind: Kind) -> list[str]:
        """Usable ids (clashing ones excluded)."""
        return sorted(self.specs[kind])

    def listing(self, kind: Kind) -> list[ComponentSpec]:
        """Every registered spec sorted by id, both sides of a clash included."""
        specs = [*self.specs[kind].values(), *(s for group in self.clashes[kind].values() for s in group)]
        return sorted(specs, key=lambda s: s.id)

    def has(self, kind: Kind, id: str) -> bool:
        """True when ``id`` is registered once (usable)."""
        return id in self.specs[kind]

    def get(self, kind: Kind, id: str) -> ComponentSpec:
        if id in self.clashes[kind]:
            raise RegistryError(self.clash_message(kind, id))
        try:
            return self.specs[kind][id]
        except KeyError:
            raise RegistryError(self.unknown_id_message(kind, id)) from None

    def unknown_id_message(self, kind: Kind, id: str) -> str:
        message = f"unknown {kind} id {id!r}."
        hint = self.known_providers.get(kind, {}).get(id)
        if hint:
            message += f" It is provided by the package {hint!r}: pip install {hint}."
        else:
            message += did_you_mean(id, self.ids(kind))
        installed = ", ".join(self.ids(kind)) or "none"
        return f"{message} Installed: {installed}. See `{LISTING_COMMAND[kind]}`."

    def make(self, kind: Kind, id: str, *args: Any, **kwargs: Any) -> Any:
        """Import the component's entry point and call it with the given arguments."""
        return self.get(kind, id).load()(*args, **kwargs)


def _import_path(path: str, what: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - re-raised with the component named
        raise RegistryError(f"{what} failed to load from {path!r}: {type(exc).__name__}: {exc}") from exc
    return obj


def did_you_mean(word: str, options: list[str]) -> str:
    """``" Did you mean 'x'?"`` or an empty string."""
    close = difflib.get_close_matches(word, options, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
