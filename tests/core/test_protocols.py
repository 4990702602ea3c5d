"""The shipped generators, trainers and engines meet the protocols of core (``skyrl_core.protocols`` and
``skyrl_core.engine``), member by member: each method is there, async where the protocol's is, and takes
every argument the protocol passes it."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
import skyrl_core
from skyrl_core.engine import (
    ClosableEngine,
    InferenceEngine,
    MemoryReleasingEngine,
    ReportingEngine,
    SleepableEngine,
    TokenizingEngine,
)
from skyrl_core.factory import generator_class, trainer_class
from skyrl_core.protocols import Generator, Trainer
from skyrl_core.registry import RegistryError

_SENTINEL = object()


def structural_problems(cls: type, protocol: type) -> list[str]:
    """What ``cls`` lacks of ``protocol``'s methods: a missing one, sync for async (or back), or a parameter of
    the protocol's that a call could not pass (by position where the protocol allows it, else by name)."""
    problems = []
    for name, declared in vars(protocol).items():
        if not inspect.isfunction(declared) or name.startswith("_"):
            continue
        impl = getattr(cls, name, None)
        if not callable(impl):
            problems.append(f"{cls.__name__}.{name} is missing")
            continue
        if inspect.iscoroutinefunction(declared) != inspect.iscoroutinefunction(impl):
            problems.append(f"{cls.__name__}.{name} is {'not ' * inspect.iscoroutinefunction(declared)}async")
        params = list(inspect.signature(declared).parameters.values())[1:]  # without self
        args = [_SENTINEL for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
        kwargs = {p.name: _SENTINEL for p in params if p.kind == p.KEYWORD_ONLY}
        try:
            inspect.signature(impl).bind(_SENTINEL, *args, **kwargs)
        except TypeError as exc:
            problems.append(f"{cls.__name__}.{name} cannot be called as the protocol's: {exc}")
    return problems


def test_the_protocols_are_exported_beside_the_engines():
    assert skyrl_core.Generator is Generator and skyrl_core.Trainer is Trainer
    assert {"Generator", "Trainer", "InferenceEngine"} <= set(skyrl_core.__all__)


def test_the_shipped_generators_are_generators():
    from skyrl_core.generator import MultiTurnGenerator

    shipped = [MultiTurnGenerator, generator_class("default")]
    try:
        from skyrl_rlm_repl.tree import RLMTreeGenerator
    except ImportError:  # pragma: no cover - the rlm_repl plugin is not installed
        pass
    else:
        shipped += [RLMTreeGenerator, generator_class("rlm_tree")]
    for cls in shipped:
        assert issubclass(cls, Generator), cls
        assert structural_problems(cls, Generator) == []


def test_the_shipped_trainer_is_a_trainer():
    pytest.importorskip("skyrl_trainers")
    from skyrl_trainers.trainer import FSDPGRPOTrainer

    assert trainer_class("fsdp_grpo") is FSDPGRPOTrainer
    assert issubclass(FSDPGRPOTrainer, Trainer) and structural_problems(FSDPGRPOTrainer, Trainer) == []


def test_the_shipped_engines_are_engines_with_their_capabilities():
    from skyrl_core.engines.openai import OpenAIEngine
    from skyrl_core.testing.scripted_engine import ScriptedEngine

    capabilities: dict[type, set[type]] = {OpenAIEngine: {TokenizingEngine}, ScriptedEngine: set()}
    try:
        from skyrl_trainers.engines.hf import HFEngine
        from skyrl_trainers.engines.remote import ProcessEngine, RayEngine
        from skyrl_trainers.engines.replicas import RayEngineReplicas
        from skyrl_trainers.engines.vllm import VLLMEngine
    except ImportError:  # pragma: no cover - skyrl-trainers is not installed
        pass
    else:
        capabilities |= {HFEngine: {ClosableEngine, MemoryReleasingEngine}, VLLMEngine: {ClosableEngine, SleepableEngine},
                         ProcessEngine: {ClosableEngine}, RayEngine: {ClosableEngine},
                         RayEngineReplicas: {ClosableEngine, ReportingEngine}}
    optional = {ClosableEngine, SleepableEngine, MemoryReleasingEngine, ReportingEngine}
    for cls, expected in capabilities.items():
        assert structural_problems(cls, InferenceEngine) == [], cls
        method_capabilities = {p for p in optional if not structural_problems(cls, p)}
        assert method_capabilities == expected - {TokenizingEngine}, cls
        assert (TokenizingEngine in expected) == hasattr(cls, "tokenizer"), cls  # the others set it per instance


def test_a_placed_engine_offers_the_capabilities_of_the_engine_it_fronts():
    pytest.importorskip("skyrl_trainers")
    from skyrl_trainers.engines.remote import RemoteEngineClient

    def client(methods: list[str]) -> Any:
        engine = RemoteEngineClient()
        engine._setup(SimpleNamespace(model=None), {"attrs": {}, "tokenizer": None, "methods": methods}, tokenizer="tok")
        return engine

    vllm_like, hf_like = client(["sleep", "wake_up"]), client(["release_memory"])
    assert isinstance(vllm_like, SleepableEngine) and not isinstance(vllm_like, MemoryReleasingEngine)
    assert isinstance(hf_like, MemoryReleasingEngine) and not isinstance(hf_like, SleepableEngine)
    assert isinstance(hf_like, TokenizingEngine) and not isinstance(hf_like, ReportingEngine)


def test_an_entry_point_that_breaks_its_protocol_is_refused_by_name(skyrl_plugin_manager, monkeypatch):
    from skyrl_core.registry import GeneratorSpec, TrainerSpec

    specs = skyrl_plugin_manager.registry.specs
    monkeypatch.setitem(specs["trainer"], "no_fit", TrainerSpec(id="no_fit", entry_point="skyrl_core.env:TextEnv"))
    monkeypatch.setitem(specs["generator"], "no_generate",
                        GeneratorSpec(id="no_generate", entry_point="skyrl_core.env:TextEnv"))
    with pytest.raises(RegistryError, match=r"trainer 'no_fit' entry point is .*TextEnv.*, not a Trainer \(fit\)"):
        trainer_class("no_fit")
    with pytest.raises(RegistryError, match=r"generator 'no_generate' entry point is .*, not a Generator"):
        generator_class("no_generate")
