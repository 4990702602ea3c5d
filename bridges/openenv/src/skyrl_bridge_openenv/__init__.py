"""skyrl-bridge-openenv: OpenEnv environments (``openenv-core``) as SkyRL text envs.

``env.name`` names the OpenEnv env: an installed OpenEnv env package (found the way ``openenv.auto`` finds them),
``demo`` (a tiny env shipped here), or ``"module:EnvironmentClass"``. ``env.mode`` runs it in this process, behind
OpenEnv's own HTTP/WebSocket server on loopback, or at a running server's ``env.url``. This module must not import
the peer: listing envs stays fast.
"""

from __future__ import annotations

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="openenv",
        entry_point="skyrl_bridge_openenv.env:OpenEnvEnv",
        config="skyrl_bridge_openenv.config:OpenEnvConfig",
        catalog="skyrl_bridge_openenv.catalog:entries",
        description="OpenEnv environments (Environment/Action/Observation): in process, through OpenEnv's own "
                    "server on loopback, or at a URL; typed actions parsed from the model's JSON or raw text.",
        max_turns=4,
        reward_range=(0.0, 1.0),
        eval_splits={"train": "test"},
    ))
