"""skyrl-bridge-verifiers: verifiers (v1) tasksets and environments as SkyRL text envs (env id ``verifiers``).

Importing this package does not import verifiers: ``skyrl envs`` stays fast.
"""

from __future__ import annotations

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="verifiers",
        entry_point="skyrl_bridge_verifiers.env:VerifiersEnv",
        config="skyrl_bridge_verifiers.config:VerifiersEnvConfig",
        catalog="skyrl_bridge_verifiers.catalog:entries",
        description="A verifiers taskset or environment (env.name: taskset id or module:function); the policy "
                    "plays its agent seat turn by turn, scored by the task's own weighted rewards.",
        max_turns=10,
        reward_range=(0.0, 1.2),
        eval_splits={},  # verifiers tasksets have one set of tasks
    ))
