"""Hook implementations: registers env ``rlm_repl``, generator ``rlm_tree`` and the env's adversarial probes
(nothing heavy imported)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, GeneratorSpec, hookimpl
from skyrl_core.hookspecs import Register

if TYPE_CHECKING:
    from skyrl_core.probe import Probe


@hookimpl
def register_envs(register: Register) -> None:
    register(EnvSpec(
        id="rlm_repl",
        entry_point="skyrl_rlm_repl.env:RLMReplEnv",
        config="skyrl_rlm_repl.config:RLMReplConfig",
        description="Recursive LM in a sandboxed persistent Python REPL; built-in tasks: evidence selection "
                    "from several papers (reward: snippet F1) and a starter curriculum of short-context questions.",
        max_turns=10,
        reward_range=(0.0, 1.0),
        default_generator="rlm_tree",
        # Held out per training split: what a run evaluates on and `skyrl rollout` plays by default.
        eval_splits={"starter": "starter_test", "train": "validation"},
        # The main job (`skyrl run --env rlm_repl --trainer fsdp_grpo`): the starter curriculum, which the
        # embedded 135M model solves now and then, so GRPO has a signal from the first step; 10 to 13
        # minutes on 2 CPU cores (README). Train on the evidence task with trainer.data_split=train.
        run_defaults={
            "env": {"max_turns": 2, "worked_example": True, "format_reward": {"block_runs": 0.1, "final_called": 0.1}},
            "generator": {"n_samples_per_prompt": 8, "max_tokens_per_turn": 64, "temperature": 0.7},
            # In row order, every three steps cover the twelve task kinds once, so any three
            # consecutive steps are equally hard and their rewards compare.
            "trainer": {"data_split": "starter", "shuffle": False, "steps": 12, "batch_size": 4, "lr": 2e-5},
        },
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


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    from skyrl_rlm_repl.probes import PROBES  # imported when the checker runs, not for every `skyrl` command

    for probe in PROBES:
        register(probe)
