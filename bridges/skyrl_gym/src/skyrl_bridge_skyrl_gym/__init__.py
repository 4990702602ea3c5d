"""skyrl-bridge-skyrl-gym: SkyRL-Gym's registered envs (gsm8k, gsm8k_multi_turn, text2sql, search, ...) as one env id.

``env.name`` picks the skyrl-gym env, ``env.args`` its env_config options. Importing this module does not
import skyrl_gym (``skyrl envs`` stays fast).
"""

from __future__ import annotations

from skyrl_core import EnvSpec, hookimpl


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="skyrl_gym",
        entry_point="skyrl_bridge_skyrl_gym.env:SkyRLGymEnv",
        config="skyrl_bridge_skyrl_gym.config:SkyRLGymConfig",
        catalog="skyrl_bridge_skyrl_gym.catalog:entries",
        description="SkyRL-Gym 0.4.0's envs (env.name: gsm8k, gsm8k_multi_turn, text2sql, search, aime) on "
                    "SkyRL's parquet/JSONL rows (env.data_files); built-in rows for gsm8k and gsm8k_multi_turn.",
        max_turns=1,
        reward_range=(0.0, 1.0),
        stop=("</sql>", "</solution>", "</search>", "</answer>"),
        eval_splits={"train": "test"},
    ))
