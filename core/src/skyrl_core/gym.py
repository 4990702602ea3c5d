"""Make SkyRL envs through ``gymnasium.make`` under the ``skyrl/`` namespace.

Importing this module registers every installed env as ``skyrl/<id>-v0``, so after
``import skyrl_core.gym`` a plain ``gymnasium.make("skyrl/reverse_text-v0")`` works; Gymnasium's
``module:id`` form (``gymnasium.make("skyrl_core.gym:skyrl/reverse_text-v0")``) imports it for you.

``task=row`` fixes the episode's task. Without it the env is wrapped in :class:`SampledTasks`, which
draws a task from the env's built-in ``split`` (default ``train``) on every ``reset``: seeded by
``reset(seed=...)`` (the same seed gives the same task) and otherwise from the env's ``np_random``
stream, as Gymnasium does for everything else random in an env. Every other keyword is an env config
field (or pass ``config={...}``). The envs declare their spaces, so Gymnasium's passive checker wraps
them like any other env and ``gymnasium.vector.SyncVectorEnv``/``AsyncVectorEnv`` run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils import seeding

from skyrl_core.env import TextEnv
from skyrl_core.factory import make_env
from skyrl_core.plugins import get_registry

NAMESPACE = "skyrl"
VERSION = 0
DEFAULT_SPLIT = "train"


class SampledTasks(gymnasium.Wrapper):
    """Draw the episode's task from a list of rows on each ``reset`` (a ``gymnasium.make`` without ``task=``).

    The draws come from a stream of their own: ``reset(seed=s)`` restarts it from ``s`` (so the
    same seed gives the same task, and the same episode), a ``reset()`` without a seed takes its next
    draw, and before any seed it is seeded from the env's ``np_random`` (Gymnasium's own seeding). ``options={"task": row}`` still picks a task explicitly. The drawn row's index is
    ``info["task_index"]``.
    """

    def __init__(self, env: TextEnv, rows: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(env)
        if not rows:
            raise ValueError(f"{type(env).__name__}: the dataset to sample tasks from is empty")
        self.rows = list(rows)
        self._task_rng: np.random.Generator | None = None

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        options = dict(options or {})
        if "task" in options:
            return self.env.reset(seed=seed, options=options)
        if seed is not None:
            self._task_rng, _ = seeding.np_random(seed)
        elif self._task_rng is None:  # never seeded: branch off the env's own (randomly seeded) stream
            self._task_rng, _ = seeding.np_random(int(self.env.unwrapped.np_random.integers(2**31)))
        index = int(self._task_rng.integers(len(self.rows)))
        obs, info = self.env.reset(seed=seed, options={**options, "task": self.rows[index]})
        return obs, {**info, "task_index": index}


def _make(env_id: str, **kwargs: Any) -> gymnasium.Env:
    task = kwargs.pop("task", None)
    split = kwargs.pop("split", None)
    config = kwargs.pop("config", None) or kwargs
    if task is not None and split is not None:
        raise TypeError(f"gymnasium.make('{gym_id(env_id)}'): give task= or split=, not both")
    env = make_env(env_id, task, config)
    if task is not None:
        return env
    split = split or DEFAULT_SPLIT
    try:
        rows = type(env).load_dataset(split, env.config)
    except NotImplementedError:
        env.close()
        raise TypeError(f"gymnasium.make('{gym_id(env_id)}'): env {env_id!r} has no built-in dataset to draw "
                        "tasks from; pass task=<a dataset row>") from None
    except Exception as exc:
        env.close()
        raise ValueError(f"gymnasium.make('{gym_id(env_id)}'): cannot load split {split!r} of env {env_id!r} "
                         f"to draw tasks from: {exc}") from exc
    if not rows:
        env.close()
        raise ValueError(f"gymnasium.make('{gym_id(env_id)}'): split {split!r} of env {env_id!r} has no rows; "
                         "pass split=<another split> or task=<a dataset row>")
    return SampledTasks(env, rows)


def gym_id(env_id: str) -> str:
    """The Gymnasium id of SkyRL env ``env_id``: ``skyrl/<id>-v0``."""
    return f"{NAMESPACE}/{env_id}-v{VERSION}"


def register_gymnasium_envs() -> list[str]:
    """Register each installed env as ``skyrl/<id>-v0``; returns the Gymnasium ids."""
    ids = []
    for env_id in get_registry().ids("env"):
        name = gym_id(env_id)
        if name not in gymnasium.registry:
            gymnasium.register(id=name, entry_point=_make, kwargs={"env_id": env_id}, order_enforce=False)
        ids.append(name)
    return ids


__all__ = ["DEFAULT_SPLIT", "NAMESPACE", "SampledTasks", "gym_id", "register_gymnasium_envs"]

register_gymnasium_envs()
