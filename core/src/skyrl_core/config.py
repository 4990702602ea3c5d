"""Run configuration: a YAML file plus dotted overrides, validated per component.

A run config has one section per component, each naming the component's ``id`` next to its options,
and a ``run`` section for the run itself::

    env: {id: rlm_repl, max_turns: 8}
    generator: {id: default, n_samples_per_prompt: 8}
    engine: {id: hf}
    trainer: {id: fsdp_grpo, model: tiny-random, lr: 1.0e-6}
    run: {output_dir: runs/rlm, seed: 0}

Overrides use dots: ``trainer.lr=1e-6 generator.step_wise=true``; values are parsed as YAML.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from skyrl_core.factory import ConfigError, component_config, config_fields, validate_config
from skyrl_core.registry import Kind, Registry, RegistryError, did_you_mean

SECTIONS: dict[str, Kind] = {"env": "env", "trainer": "trainer", "generator": "generator", "engine": "engine"}
DEFAULT_IDS = {"generator": "default", "engine": "hf"}  # the env's spec may name another generator


class RunOptions(BaseModel):
    """The ``run`` section: where outputs go and how the run is logged."""

    model_config = ConfigDict(extra="forbid")

    output_dir: str | None = Field(None, description="Run folder; default runs/<env>-<trainer>-<time>.")
    seed: int = Field(0, description="Seeds data order, initialisation and sampling of the run.")
    resume: str | None = Field(None, description="Run folder to continue from its last checkpoint.")
    wandb_project: str | None = Field(None, description="Log to Weights & Biases under this project.")
    wandb_mode: str | None = Field(None, description="online/offline; default offline without WANDB_API_KEY.")
    console: bool = Field(True, description="Rich progress bars and tables on the console.")
    ray_address: str | None = Field(
        None, description="Ray cluster to join for everything placed on Ray (env workers, engine replicas, trainer "
        "ranks): auto (the `ray start` of this machine), HOST:PORT or ray://HOST:10001; default: a local Ray, "
        "started only when something needs it.")


@dataclass
class ResolvedConfig:
    """Every section validated against its component's config class."""

    env_id: str
    env: BaseModel
    generator_id: str
    generator: BaseModel | None
    engine_id: str
    engine: BaseModel | None
    trainer_id: str | None
    trainer: BaseModel | None
    run: RunOptions

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for section in SECTIONS:
            if getattr(self, f"{section}_id") is None:
                continue
            options = getattr(self, section)
            out[section] = {"id": getattr(self, f"{section}_id"),
                            **(options.model_dump(mode="json") if options is not None else {})}
        out["run"] = self.run.model_dump(mode="json")
        return out

    def default_output_dir(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Path(self.run.output_dir or f"runs/{self.env_id}-{self.trainer_id or 'rollout'}-{stamp}")


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "a.c=x"]`` -> ``{"a": {"b": 1, "c": "x"}}``."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        value = _parse_value(item, raw)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is already set to a value")
        node[leaf] = value
    return tree


def _parse_value(item: str, raw: str) -> Any:
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML: {yaml_problem(exc)}") from None
    if isinstance(value, str):
        try:  # YAML 1.1 reads "1e-6" as a string; users mean the number
            return float(value)
        except ValueError:
            pass
    return value


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        line = text.splitlines()[mark.line] if mark is not None and mark.line < len(text.splitlines()) else None
        shown = f"\n  {mark.line + 1} | {line}" if line is not None else ""
        raise ConfigError(f"{where}: config file is not valid YAML: {yaml_problem(exc, position=False)}{shown}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections")
    return data


def yaml_problem(exc: yaml.YAMLError, *, position: bool = True) -> str:
    """PyYAML's error in one line, without its ``in "<unicode string>"`` marks (callers name the source):
    ``mapping values are not allowed here (line 3, column 9)``, plus where the enclosing block began."""
    problem = getattr(exc, "problem", None)
    if problem is None:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    mark = getattr(exc, "problem_mark", None)
    text = problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None and position else "")
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        text += f", {context}" + (f" at line {context_mark.line + 1}" if context_mark is not None else "")
    return text


def env_run_defaults(layers: Sequence[Mapping[str, Any]], registry: Registry, *,
                     rollout: bool = False) -> dict[str, Any]:
    """The env's ``run_defaults`` for the components ``layers`` choose, as a config layer to put first
    (with ``rollout``, for playing the env without training: its ``rollout_defaults`` over them).

    Only options that the chosen component's config declares are kept (a recommendation for
    ``fsdp_grpo`` must not break a run with another trainer); an unknown env id gives ``{}`` here
    and its did-you-mean error from :func:`build_config`.
    """
    raw: dict[str, Any] = {}
    for layer in layers:
        raw = merge(raw, layer)
    env_id = raw.get("env", {}).get("id")
    if not registry.has("env", str(env_id)):
        return {}
    spec = registry.get("env", str(env_id))
    ids = {**DEFAULT_IDS, **({"generator": spec.default_generator} if spec.default_generator else {}), "env": env_id}
    layer: dict[str, Any] = {}
    recommended = merge(spec.run_defaults, spec.rollout_defaults) if rollout else spec.run_defaults
    for section, options in recommended.items():
        component_id = raw.get(section, {}).get("id", ids.get(section))
        kind = SECTIONS.get(section)
        if kind is None or component_id is None or not registry.has(kind, str(component_id)):
            continue
        declared = config_fields(kind, str(component_id), registry)
        kept = {key: value for key, value in options.items() if key in declared}
        if kept:
            layer[section] = kept
    return layer


def build_config(*layers: Mapping[str, Any], registry: Registry, need_trainer: bool = True) -> ResolvedConfig:
    """Merge layers (defaults, YAML file, CLI flags, overrides; later wins) and validate them.

    Without ``need_trainer`` (rollouts, evaluation) a missing ``trainer`` section is allowed.
    """
    raw: dict[str, Any] = {}
    for layer in layers:
        raw = merge(raw, layer)
    allowed = [*SECTIONS, "run"]
    for key, value in raw.items():
        if key not in allowed:
            raise ConfigError(f"unknown config section {key!r}.{did_you_mean(key, allowed)} "
                              f"Sections: {', '.join(allowed)}")
        if not isinstance(value, Mapping):
            raise ConfigError(f"config section {key!r} must be a mapping, got {value!r}")
    resolved: dict[str, Any] = {}
    defaults = dict(DEFAULT_IDS)
    for section, kind in SECTIONS.items():
        options = dict(raw.get(section, {}))
        component_id = options.pop("id", defaults.get(section))
        if section == "env" and component_id is not None:
            env_default = getattr(registry.get("env", str(component_id)), "default_generator", None)
            defaults["generator"] = env_default or defaults["generator"]
        if component_id is None and section == "trainer" and not need_trainer:
            resolved["trainer_id"], resolved["trainer"] = None, None
            continue
        if component_id is None:
            raise ConfigError(f"{section}.id is required (see `skyrl {kind}s`)")
        registry.get(kind, str(component_id))  # unknown id -> did-you-mean error
        resolved[f"{section}_id"] = str(component_id)
        resolved[section] = component_config(kind, str(component_id), options, registry)
    resolved["run"] = validate_config(RunOptions, raw.get("run", {}), "run")
    return ResolvedConfig(**resolved)


RUN_CONFIG_FILE = "config.yaml"  # the resolved config a run writes into its folder (skyrl_trainers.run_folder)
CHECKPOINT_KEYS = ("env.id", "trainer.id", "trainer.model", "trainer.lora.rank")  # what a checkpoint is bound to


def dotted_get(tree: Mapping[str, Any], key: str) -> Any:
    """``tree["a"]["b"]`` for ``key="a.b"``; ``None`` where any part is missing."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def resumed_run_layer(layers: Sequence[Mapping[str, Any]], registry: Registry) -> dict[str, Any]:
    """The saved config of the run that ``layers`` resume (``run.resume``), as the layer to put under them;
    ``{}`` when they resume nothing.

    The saved file is fully resolved; only the values that differ from their component's defaults are
    kept, so that an option the run left alone stays "not set" (a trainer may fill it, e.g. ``engine.model``
    from ``trainer.model``). A section whose id ``layers`` change (``engine.id=vllm``) starts afresh.
    Raises :class:`ConfigError` when the folder holds no saved config, or when ``layers`` ask for another
    value of a key the checkpoint is bound to (:data:`CHECKPOINT_KEYS`), naming both values.
    """
    asked: dict[str, Any] = {}
    for layer in layers:
        asked = merge(asked, layer)
    run_dir = dotted_get(asked, "run.resume")
    if not run_dir:
        return {}
    saved = _saved_run_config(str(run_dir))
    for key in CHECKPOINT_KEYS:
        check_resume_key(str(run_dir), key, dotted_get(saved, key), dotted_get(asked, key))
    kept: dict[str, Any] = {}
    for section, options in saved.items():
        if not isinstance(options, Mapping):
            continue
        asked_id, saved_id = dotted_get(asked, f"{section}.id"), options.get("id")
        if section in SECTIONS and asked_id is not None and asked_id != saved_id:
            continue
        kept[section] = _without_defaults(section, dict(options), registry)
    return kept


def _saved_run_config(run_dir: str) -> dict[str, Any]:
    """``RUN_DIR/config.yaml``, or a :class:`ConfigError` saying why the folder is not a run's."""
    saved_file = Path(run_dir) / RUN_CONFIG_FILE
    if not saved_file.is_file():
        what = "does not exist" if not Path(run_dir).exists() else f"holds no {RUN_CONFIG_FILE}"
        raise ConfigError(f"--resume {run_dir}: the folder {what}; give the folder of a run that `skyrl run` "
                          f"started (it holds {RUN_CONFIG_FILE} and checkpoints/)")
    return load_yaml(saved_file)


def _without_defaults(section: str, options: dict[str, Any], registry: Registry) -> dict[str, Any]:
    """``options`` less the values equal to the section's defaults (all of them where those are unknown)."""
    try:
        if section == "run":
            defaults = RunOptions().model_dump(mode="json")
        elif section in SECTIONS and options.get("id") is not None:
            model = component_config(SECTIONS[section], str(options["id"]), {}, registry)
            defaults = model.model_dump(mode="json") if model is not None else {}
        else:
            return options
    except (ConfigError, RegistryError):  # an id no longer installed, or a config with required options
        return options
    return {key: value for key, value in options.items() if key == "id" or defaults.get(key, object()) != value}


def check_resume_key(run_dir: str, key: str, saved: Any, asked: Any) -> None:
    """Refuse a command that asks for another ``key`` than the run's checkpoint was trained with."""
    if asked is None or saved is None or asked == saved:
        return
    raise ConfigError(f"--resume {run_dir} was trained with {key}={saved}; this command asks for {key}={asked}. "
                      f"A resumed run keeps its {key}: drop that option, or start a new run (another "
                      "run.output_dir) to train with the other value")
