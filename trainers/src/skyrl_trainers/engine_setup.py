"""Build the rollout engine for a training run: it must generate with the policy being trained.

The engine loads ``trainer.model`` itself (``hf``: a copy in the driver process; ``vllm``: its own
GPU copy), and the trainer pushes its weights into it before the first rollout and after every step.
"""

from __future__ import annotations

from typing import Any

from skyrl_core.config import ResolvedConfig
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry


def engine_config_for_policy(config: ResolvedConfig, seed: int | None = None) -> Any:
    """The engine section with ``model`` set to ``trainer.model`` (an explicit mismatch is an error) and,
    unless the user chose one, its sampling ``seed`` set to ``seed``."""
    engine_cfg, policy = config.engine, config.trainer.model
    if engine_cfg is None:
        return engine_cfg
    fields, chosen = type(engine_cfg).model_fields, engine_cfg.model_fields_set
    update: dict[str, Any] = {}
    if "model" in fields:
        if "model" in chosen and engine_cfg.model not in (None, policy):
            raise ConfigError(f"engine.model={engine_cfg.model!r} differs from trainer.model={policy!r}; the engine "
                              "generates with the policy being trained, so set only trainer.model")
        update["model"] = policy
    if "seed" in fields and "seed" not in chosen and seed is not None:
        update["seed"] = seed
    return engine_cfg.model_copy(update=update)


def build_engine(config: ResolvedConfig, seed: int | None = None) -> tuple[Any, Any]:
    """``(engine, tokenizer)`` for the run's ``engine`` section, loaded with ``trainer.model``."""
    engine = get_registry().get("engine", config.engine_id).load()(engine_config_for_policy(config, seed))
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        raise ConfigError(f"engine {config.engine_id!r} exposes no tokenizer; the trainer needs one to build prompts")
    return engine, tokenizer


def sleeps_between_rollouts(engine: Any) -> bool:
    """True for an engine that can free its GPU memory while the trainer runs (vLLM with
    ``engine.enable_sleep_mode=true``): it is put to sleep after each rollout and woken for the weight sync."""
    config = getattr(engine, "config", None)
    return bool(getattr(config, "enable_sleep_mode", False)) and hasattr(engine, "sleep") and hasattr(engine, "wake_up")
