"""skyrl-bridge-textarena: TextArena's games as skyrl envs (``env.name`` = a TextArena id such as GuessTheNumber-v0).

Importing this package does not import TextArena; the env, its config and the catalogue do.
"""

from __future__ import annotations

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="textarena",
        entry_point="skyrl_bridge_textarena.env:TextArenaEnv",
        config="skyrl_bridge_textarena.config:TextArenaEnvConfig",
        catalog="skyrl_bridge_textarena.catalog:entries",
        description="TextArena games (env.name, e.g. GuessTheNumber-v0, TicTacToe-v0): the policy plays one seat "
                    "turn by turn, a scripted opponent the other; TextArena's final reward at the end.",
        max_turns=64,  # the default game (GuessTheNumber-v0) has its own limit; this is config.max_turns
        reward_range=(0.0, 1.0),  # GuessTheNumber-v0's
        stop=(),
        eval_splits={"train": "test"},
    ))
