"""Make SkyRL envs through ``gymnasium.make`` under the ``skyrl/`` namespace.

``gymnasium.make("skyrl_core.gym:skyrl/reverse_text", task=row)`` imports this module first
(Gymnasium's ``module:id`` form), which registers every installed env as ``skyrl/<id>``. The envs
declare their spaces (``TextEnv.action_space``, ``TextEnv.observation_space``), so Gymnasium's
passive checker wraps them like any other env and ``gymnasium.utils.env_checker.check_env`` passes.
"""

from __future__ import annotations

from typing import Any

import gymnasium

from skyrl_core.factory import make_env
from skyrl_core.plugins import get_registry

NAMESPACE = "skyrl"


def _make(env_id: str, **kwargs: Any) -> Any:
    return make_env(env_id, kwargs.pop("task", None), kwargs.pop("config", None) or kwargs)


def register_gymnasium_envs() -> list[str]:
    """Register each installed env as ``skyrl/<id>``; returns the Gymnasium ids."""
    ids = []
    for env_id in get_registry().ids("env"):
        gym_id = f"{NAMESPACE}/{env_id}"
        if gym_id not in gymnasium.registry:
            gymnasium.register(id=gym_id, entry_point=_make, kwargs={"env_id": env_id}, order_enforce=False)
        ids.append(gym_id)
    return ids


register_gymnasium_envs()
