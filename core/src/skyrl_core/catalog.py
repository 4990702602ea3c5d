"""Catalogues: one env id that hosts many named envs (a bridge to another ecosystem).

A bridge registers one :class:`~skyrl_core.registry.EnvSpec` whose ``catalog`` names a function that
lists the peer's envs as :class:`CatalogEntry` records; its config subclasses :class:`CatalogEnvConfig`, so
every bridge is driven the same way: ``env.name`` picks the peer's env and ``env.args`` carries the peer's
own options. ``skyrl envs --catalog ID`` prints the entries; ``skyrl check ID --catalog`` scores them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pydantic import Field

from skyrl_core.env import EnvConfig
from skyrl_core.registry import Registry, RegistryError, _import_path


class CatalogEnvConfig(EnvConfig):
    """Options of an env id that hosts a catalogue: which of its envs, and that env's own options."""

    name: str = Field(..., min_length=1, description="The catalogue's env to run (`skyrl envs --catalog ID` "
                                                     "lists them).")
    args: dict[str, Any] = Field(default_factory=dict, description="The peer env's own options, passed to it "
                                                                   "as they are (e.g. env.args.size=5).")


@dataclass(frozen=True)
class CatalogEntry:
    """One env of a catalogue, as listed: enough to choose it without building it.

    ``reward_range`` and ``max_turns`` are what the bridge declares for it (``None``: the bridge's
    defaults); ``tags`` are short labels (``"multi-turn"``, ``"two-player"``, ``"needs nltk:words"``).
    """

    name: str
    description: str = ""
    multi_turn: bool = False
    reward_range: tuple[float, float] | None = None
    max_turns: int | None = None
    tags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["reward_range"] = list(self.reward_range) if self.reward_range is not None else None
        record["tags"] = list(self.tags)
        return record


def catalog_entries(env_id: str, registry: Registry | None = None) -> list[CatalogEntry]:
    """The entries of env ``env_id``'s catalogue, sorted by name; a clear error when it has none."""
    from skyrl_core.plugins import get_registry

    spec = (registry or get_registry()).get("env", env_id)
    path = getattr(spec, "catalog", None)
    if path is None:
        raise RegistryError(f"env {env_id!r} has no catalogue: it is one env, not a bridge to many "
                            f"(catalogues: {', '.join(catalog_ids(registry)) or 'none installed'})")
    listed = _import_path(path, f"env {env_id!r} catalog")()
    return sorted((_entry(item, env_id) for item in listed), key=lambda entry: entry.name)


def catalog_ids(registry: Registry | None = None) -> list[str]:
    """The env ids that host a catalogue."""
    from skyrl_core.plugins import get_registry

    registry = registry or get_registry()
    return [spec.id for spec in registry.listing("env") if getattr(spec, "catalog", None)]


def _entry(item: CatalogEntry | str, env_id: str) -> CatalogEntry:
    if isinstance(item, CatalogEntry):
        return item
    if isinstance(item, str) and item:
        return CatalogEntry(item)
    raise RegistryError(f"env {env_id!r} catalog listed {item!r}; expected a CatalogEntry or a name")

