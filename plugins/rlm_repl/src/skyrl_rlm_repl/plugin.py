"""Hook implementations: registers env ``rlm_repl`` and generator ``rlm_tree`` (nothing heavy imported)."""

from __future__ import annotations

from skyrl_core import EnvSpec, GeneratorSpec, hookimpl
from skyrl_core.hookspecs import Register


@hookimpl
def register_envs(register: Register) -> None:
    register(EnvSpec(
        id="rlm_repl",
        entry_point="skyrl_rlm_repl.env:RLMReplEnv",
        config="skyrl_rlm_repl.config:RLMReplConfig",
        description="Recursive LM in a sandboxed persistent Python REPL; built-in task: evidence selection "
                    "from several papers (reward: snippet F1).",
        max_turns=10,
        reward_range=(0.0, 1.0),
        default_generator="rlm_tree",
    ))


@hookimpl
def register_generators(register: Register) -> None:
    register(GeneratorSpec(
        id="rlm_tree",
        entry_point="skyrl_rlm_repl.tree:RLMTreeGenerator",
        config="skyrl_rlm_repl.tree:RLMTreeConfig",
        description="Tree rollouts for rlm_repl: rlm_query runs a child episode with its own REPL, "
                    "llm_query a plain completion; per-rollout depth/call/token limits.",
    ))
