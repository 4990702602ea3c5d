"""Typed options of reasoning-gym's ``composite`` dataset: ``env.args.datasets=[{name, weight, config}]``.

The peer's own ``CompositeConfig`` takes its dataset specs unchecked (a misspelt option of a sub-dataset only
fails deep inside it, as a ``TypeError`` of the sub-dataset's dataclass); here each spec is a pydantic model whose
``name`` must be a registered dataset and whose ``config`` is checked against that dataset's options like
``env.args`` is for a single dataset, so every mistake is reported with its place:
``env.args.datasets[1].config.max_value: ...``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from skyrl_bridge_reasoning_gym import peer


class CompositeDatasetSpec(BaseModel):
    """One dataset of the mix."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, description="A registered reasoning-gym dataset (not 'composite').")
    weight: float = Field(1.0, gt=0, description="Its share of the items, relative to the others' weights.")
    config: dict[str, Any] = Field(default_factory=dict, description="That dataset's own options.")

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        peer.check_name(value)
        if value == peer.COMPOSITE:
            raise ValueError("a composite cannot hold another composite")
        return value


class CompositeArgs(BaseModel):
    """``env.args`` of ``env.name=composite``."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[CompositeDatasetSpec] = Field(..., min_length=1, description="The datasets to mix.")
    size: int | None = Field(None, ge=1, le=peer.MAX_ROWS, description="Train rows (default 64).")
    seed: int | None = Field(None, ge=0, le=peer.MAX_SEED, description="Seed of the train rows (default 0).")

    @model_validator(mode="after")
    def _unique(self) -> CompositeArgs:
        names = [spec.name for spec in self.datasets]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"dataset {name!r} is listed {names.count(name)} times; list each once "
                                 f"(reasoning-gym's composite keys its datasets by name)")
        return self


def parse_composite_args(args: Mapping[str, Any], where: str = "env.args") -> CompositeArgs:
    if "datasets" not in args:
        raise ValueError(f"{where}.datasets: reasoning-gym's 'composite' mixes datasets you list, e.g. "
                         f"env.args.datasets='[{{\"name\": \"chain_sum\", \"weight\": 1}}, "
                         f"{{\"name\": \"spell_backward\", \"weight\": 2, \"config\": {{\"min_word_len\": 4}}}}]'")
    try:
        parsed = CompositeArgs.model_validate(dict(args))
    except ValidationError as exc:
        raise ValueError("invalid options of reasoning-gym's 'composite': " + "; ".join(
            f"{_place(where, err['loc'])}: {err['msg']}" for err in exc.errors())) from None
    for number, spec in enumerate(parsed.datasets):
        peer.validate_args(spec.name, spec.config, where=f"{where}.datasets[{number}].config")
    return parsed


def validate_composite_args(args: Mapping[str, Any], where: str = "env.args") -> dict[str, Any]:
    return parse_composite_args(args, where).model_dump(exclude_none=True)


def peer_composite_config(options: Mapping[str, Any]) -> Any:
    """The peer's ``CompositeConfig`` for validated ``options`` (sub-configs as their dataclasses hold them)."""
    from reasoning_gym.composite import CompositeConfig, DatasetSpec

    parsed = parse_composite_args(options)
    specs = []
    for spec in parsed.datasets:
        config = peer.build_config(spec.name, spec.config)
        specs.append(DatasetSpec(name=spec.name, weight=spec.weight,
                                 config={key: getattr(config, key) for key in spec.config}))
    return CompositeConfig(size=parsed.size or peer.DEFAULT_TRAIN_SIZE, seed=parsed.seed, datasets=specs)


def _place(where: str, loc: tuple[Any, ...]) -> str:
    text = where
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text
