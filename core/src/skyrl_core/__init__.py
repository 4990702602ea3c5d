"""skyrl-core: the plugin core of the SkyRL ecosystem.

Names are imported lazily so ``import skyrl_core`` and ``skyrl envs`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from skyrl_core.hookspecs import hookimpl

_EXPORTS = {
    "ComponentSpec": "registry", "EnvSpec": "registry", "GeneratorSpec": "registry",
    "TrainerSpec": "registry", "EngineSpec": "registry", "Registry": "registry",
    "RegistryError": "registry",
    "TextEnv": "env", "EnvConfig": "env", "StepResult": "env", "Message": "env",
    "CatalogEnvConfig": "catalog", "CatalogEntry": "catalog",
    "RewardFn": "rewards", "Rubric": "rewards",
    "Turn": "trajectory", "Trajectory": "trajectory", "TrajectoryBatch": "trajectory",
    "InferenceEngine": "engine", "SamplingParams": "engine", "GenerateOutput": "engine",
    "EngineError": "engine", "Generator": "protocols", "Trainer": "protocols",
    "MultiTurnGenerator": "generator", "GeneratorConfig": "generator",
    "ChatRenderer": "chat",
    "get_plugin_manager": "plugins", "get_registry": "plugins",
    "make_env": "factory", "ConfigError": "factory",
}

__all__ = ["hookimpl", *_EXPORTS]

if TYPE_CHECKING:
    from skyrl_core.catalog import CatalogEntry, CatalogEnvConfig
    from skyrl_core.chat import ChatRenderer
    from skyrl_core.engine import EngineError, GenerateOutput, InferenceEngine, SamplingParams
    from skyrl_core.env import EnvConfig, Message, StepResult, TextEnv
    from skyrl_core.factory import ConfigError, make_env
    from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
    from skyrl_core.plugins import get_plugin_manager, get_registry
    from skyrl_core.protocols import Generator, Trainer
    from skyrl_core.registry import (
        ComponentSpec,
        EngineSpec,
        EnvSpec,
        GeneratorSpec,
        Registry,
        RegistryError,
        TrainerSpec,
    )
    from skyrl_core.rewards import RewardFn, Rubric
    from skyrl_core.trajectory import Trajectory, TrajectoryBatch, Turn


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'skyrl_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"skyrl_core.{module}"), name)
    globals()[name] = value
    return value
