"""Every shipped env is a real ``gymnasium.Env``: Gymnasium's own checker passes on it.

The envs are made the way a Gymnasium user makes them, ``gymnasium.make("skyrl/<id>-v0")`` after
``import skyrl_core.gym``, with a task row or with tasks drawn from the env's built-in split.
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
    env = gymnasium.make(f"skyrl_core.gym:skyrl/{env_id}-v0", task=row)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env.unwrapped)
    finally:
        env.close()
    assert [str(w.message) for w in caught] == []


def test_spaces_describe_actions_and_observations() -> None:
    cls = _installed_env("reverse_text")
    env = gymnasium.make("skyrl_core.gym:skyrl/reverse_text-v0", task={"text": "ab"}, max_action_chars=10)
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


#: Config that lets each shipped env run on a machine without Docker.
NO_DOCKER = {"harbor_terminal": {"backend": "bwrap"}}


def _no_docker_kwargs(env_id: str) -> dict[str, object]:
    _installed_env(env_id)
    if env_id == "harbor_terminal":
        from skyrl_sandbox.testing import require_backend

        require_backend("bwrap")
    return dict(NO_DOCKER.get(env_id, {}))


def test_plain_gymnasium_make_works_after_importing_skyrl_core_gym() -> None:
    import subprocess
    import sys

    code = ("import gymnasium, skyrl_core.gym\n"
            "env = gymnasium.make('skyrl/reverse_text-v0')\n"
            "obs, info = env.reset(seed=0)\n"
            "print(sorted(gymnasium.registry.keys() & {'skyrl/reverse_text-v0', 'skyrl/sql-v0'}), 'task_index' in info)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'skyrl/reverse_text-v0'" in out.stdout and out.stdout.strip().endswith("True")


@pytest.mark.parametrize("env_id", SHIPPED_ENVS)
def test_make_without_a_task_draws_one_reproducibly_from_the_default_split(env_id: str) -> None:
    kwargs = _no_docker_kwargs(env_id)
    cls = env_class(env_id)
    rows = cls.load_dataset("train", cls.config_class(**kwargs))
    env = gymnasium.make(f"skyrl/{env_id}-v0", **kwargs)
    try:
        first, info = env.reset(seed=3)
        again, info_again = env.reset(seed=3)
        assert first == again and info["task_index"] == info_again["task_index"]
        assert env.unwrapped.task == rows[info["task_index"]]
        # different seeds reach different tasks, and unseeded resets go on drawing from the seeded stream
        assert len({env.reset(seed=seed)[1]["task_index"] for seed in range(12)}) > 1
        env.reset(seed=3)
        stream = [env.reset()[1]["task_index"] for _ in range(5)]
        env.reset(seed=3)
        assert [env.reset()[1]["task_index"] for _ in range(5)] == stream
        # an explicit task still wins
        obs, info = env.reset(options={"task": rows[0]})
        assert env.unwrapped.task == rows[0] and "task_index" not in info
    finally:
        env.close()


@pytest.mark.parametrize("env_id", SHIPPED_ENVS)
def test_sync_vector_env_resets_seeded_and_steps(env_id: str) -> None:
    kwargs = _no_docker_kwargs(env_id)
    vec = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make(f"skyrl/{env_id}-v0", **kwargs) for _ in range(2)])
    try:
        obs, info = vec.reset(seed=5)
        assert all(o in vec.single_observation_space for o in obs)
        for i, sub in enumerate(vec.envs):  # sub-env i is seeded with 5 + i, like a lone env reset with it
            single = gymnasium.make(f"skyrl/{env_id}-v0", **kwargs)
            try:
                assert single.reset(seed=5 + i)[0] == obs[i] and single.unwrapped.task == sub.unwrapped.task
            finally:
                single.close()
        actions = tuple(sub.unwrapped.gold_actions()[0] for sub in vec.envs)
        obs, reward, terminated, truncated, info = vec.step(actions)
        assert reward.shape == terminated.shape == truncated.shape == (2,)
        assert all(o in vec.single_observation_space for o in obs)
        ended = [bool(t or u) for t, u in zip(terminated, truncated, strict=True)]
        assert [sub.unwrapped.done for sub in vec.envs] == ended
        assert "error" not in info, info.get("error")
    finally:
        vec.close()


def test_async_vector_env_runs_without_shared_memory() -> None:
    _installed_env("reverse_text")
    fns = [lambda: gymnasium.make("skyrl/reverse_text-v0") for _ in range(2)]
    with pytest.raises(TypeError, match="disable `shared_memory`"):  # text spaces have no fixed size
        gymnasium.vector.AsyncVectorEnv(fns)
    vec = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False)
    try:
        obs, _ = vec.reset(seed=0)
        texts = [o[-1]["content"] for o in obs]
        _, reward, terminated, _, _ = vec.step(tuple(f"<answer>{t[::-1]}</answer>" for t in texts))
        assert list(reward) == [1.0, 1.0] and all(terminated)
    finally:
        vec.close()


class NoDatasetPlugin:
    from skyrl_core import EnvSpec, hookimpl

    @hookimpl
    def register_envs(self, register):
        register(self.EnvSpec(id="no_dataset", entry_point="skyrl_core.env:TextEnv", description="no rows"))


def test_make_without_a_task_fails_at_make_for_an_env_without_a_dataset(register_skyrl_plugin) -> None:
    from skyrl_core.gym import register_gymnasium_envs

    register_skyrl_plugin(NoDatasetPlugin())
    assert "skyrl/no_dataset-v0" in register_gymnasium_envs()
    try:
        with pytest.raises(TypeError, match=r"no built-in dataset to draw tasks from; pass task="):
            gymnasium.make("skyrl/no_dataset-v0")
        env = gymnasium.make("skyrl/no_dataset-v0", task={"prompt": "hi"})
        assert env.reset(seed=0)[0] == [{"role": "user", "content": "hi"}]
        with pytest.raises(TypeError, match="task= or split="):
            gymnasium.make("skyrl/no_dataset-v0", task={"prompt": "hi"}, split="test")
    finally:
        del gymnasium.registry["skyrl/no_dataset-v0"]


def test_split_chooses_the_rows_tasks_are_drawn_from() -> None:
    cls = _installed_env("reverse_text")
    rows = cls.load_dataset("test", cls.config_class())
    env = gymnasium.make("skyrl/reverse_text-v0", split="test")
    _, info = env.reset(seed=1)
    assert env.unwrapped.task == rows[info["task_index"]] and env.unwrapped.task["id"].startswith("test-")
