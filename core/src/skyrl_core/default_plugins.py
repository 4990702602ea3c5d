"""Core's own components, registered through the same hooks as any third-party plugin."""

from __future__ import annotations

from skyrl_core.hookspecs import Register, hookimpl
from skyrl_core.registry import EngineSpec, GeneratorSpec


@hookimpl
def register_generators(register: Register) -> None:
    register(GeneratorSpec(
        id="default", entry_point="skyrl_core.generator:MultiTurnGenerator",
        description="Concurrent multi-turn rollouts, token in/token out, GRPO groups, step-wise mode.",
        config="skyrl_core.generator:GeneratorConfig"))


@hookimpl
def register_inference_engines(register: Register) -> None:
    register(EngineSpec(
        id="openai", entry_point="skyrl_core.engines.openai:OpenAIEngine",
        description="Any OpenAI-compatible server (vLLM serve, SGLang, llama.cpp, hosted APIs).",
        config="skyrl_core.engines.openai:OpenAIEngineConfig", needs_network=True))
