"""Every shipped env is a real ``gymnasium.Env``: Gymnasium's own checker passes on it.

The envs are made the way a Gymnasium user makes them, ``gymnasium.make("skyrl_core.gym:skyrl/<id>")``.
An env whose plugin is not installed is skipped, except in CI (any ``SKYRL_REQUIRE_*`` variable set),
where every shipped env must be there.
"""

from __future__ import annotations

import os
import string
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from skyrl_core.env import TextEnv
from skyrl_core.factory import env_class
from skyrl_core.plugins import get_registry

SHIPPED_ENVS = ["reverse_text", "sql", "rlm_repl", "harbor_terminal", "search"]


def _installed_env(env_id: str) -> type[TextEnv]:
    if env_id not in get_registry().ids("env"):
        required = sorted(k for k in os.environ if k.startswith("SKYRL_REQUIRE_"))
        if required:
            pytest.fail(f"env {env_id!r} is not installed, but {', '.join(required)} is set (CI needs every env)")
        pytest.skip(f"env {env_id!r} is not installed")
    return env_class(env_id)


@pytest.mark.parametrize("env_id", SHIPPED_ENVS)
def test_gymnasium_check_env_passes_without_warnings(env_id: str) -> None:
    cls = _installed_env(env_id)
    row = cls.load_dataset("train", cls.config_class())[0]
    env = gymnasium.make(f"skyrl_core.gym:skyrl/{env_id}", task=row)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env.unwrapped)
    finally:
        env.close()
    assert [str(w.message) for w in caught] == []


def test_spaces_describe_actions_and_observations() -> None:
    cls = _installed_env("reverse_text")
    env = gymnasium.make("skyrl_core.gym:skyrl/reverse_text", task={"text": "ab"}, max_action_chars=10)
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    assert [{"role": "user", "content": "ünïcode ✓ \x00"}] in env.observation_space
    assert [{"role": "user"}] not in env.observation_space
    assert "x" * 10 in env.action_space and "x" * 11 not in env.action_space
    env.action_space.seed(0)
    for _ in range(20):
        sample = env.action_space.sample()
        assert len(sample) <= 10 and set(sample) <= set(string.printable)
    message = env.observation_space.sample()
    assert isinstance(message, list) and message in env.observation_space
    assert isinstance(env.unwrapped, cls)
