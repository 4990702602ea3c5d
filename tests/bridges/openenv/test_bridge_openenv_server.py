"""The openenv bridge through OpenEnv's own server and client: mode 'server' (a server subprocess on 127.0.0.1)
and mode 'url' (a running server). End to end, the same episode as in process; a killed, a silent, a broken and a
never-ready server each end in a clear error within the timeout, never a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

ECHO = {"name": "bridge_openenv_toys:EchoEnvironment", "max_turns": 3}
GUESS = "bridge_openenv_toys:GuessEnvironment"


@pytest.fixture(autouse=True)
def _toys(toys_on_path):
    return toys_on_path


def episode(config, actions_from_gold=True, seed=4):
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(config=config)
    try:
        prompt, _ = env.reset(seed=seed)
        gold = OpenEnvEnv(config={**config, "mode": "inprocess"})
        gold.reset(seed=seed)
        actions = ["wrong", *gold.gold_actions()]
        gold.close()
        steps = [env.step(action) for action in actions]
        return prompt, [(s.observation, s.reward, s.terminated, s.truncated) for s in steps]
    finally:
        env.close()


def test_server_mode_plays_the_same_episode_as_in_process_through_openenvs_server():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    served = episode({**ECHO, "mode": "server"})
    assert served == episode(ECHO)
    assert sum(step[1] for step in served[1]) == 1.0 and served[1][-1][2]  # terminated by the env's done
    env = OpenEnvEnv(config={**ECHO, "mode": "server"})
    assert env.gold_actions() is None  # a server cannot be asked for them


def test_server_mode_async_steps_and_close_stops_the_server():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    async def play():
        env = OpenEnvEnv(config={"name": GUESS, "max_turns": 7, "mode": "server", "args": {"high": 1}})
        prompt, _ = await env.areset(seed=0)
        invalid = await env.astep("one")
        right = await env.astep('{"guess": 1}')
        return env, prompt, invalid, right

    env, prompt, invalid, right = asyncio.run(play())
    process = env._runtime.server.process
    assert "from 1 to 1." in prompt[0]["content"]  # env.args reached the server's constructor
    assert invalid.info["invalid_action"] and invalid.reward == 0.0
    assert (right.reward, right.terminated) == (1.0, True)
    env.close()
    assert process.poll() is not None
    env.close()  # twice is harmless


def test_a_killed_server_ends_the_episode_truncated_with_a_clear_error():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(config={**ECHO, "mode": "server", "timeout_s": 20})
    env.reset(seed=0)
    assert env.step("wrong").info == {}
    os.kill(env._runtime.server.process.pid, signal.SIGKILL)
    started = time.monotonic()
    result = env.step("anything")
    assert time.monotonic() - started < 5
    assert result.truncated and not result.terminated and result.reward == 0.0
    assert "OpenEnv server" in result.info["error"] and "killed by signal 9" in result.info["error"]
    env.close()


def test_a_server_that_stops_answering_times_out_with_a_clear_error():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(config={**ECHO, "name": "bridge_openenv_toys:SlowEnvironment", "mode": "server",
                             "timeout_s": 1, "args": {"delay": 20}})
    env.reset(seed=0)
    started = time.monotonic()
    result = env.step("apple")
    assert time.monotonic() - started < 6
    assert result.truncated and "did not answer step within 1 s" in result.info["error"]
    env.close()


def test_a_server_whose_env_cannot_be_built_fails_reset_with_its_message():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(config={"name": "bridge_openenv_toys:BrokenEnvironment", "mode": "server", "timeout_s": 10})
    with pytest.raises(RuntimeError, match="needs a data file that is not here"):
        env.reset(seed=0)
    env.close()


def test_a_server_that_never_gets_ready_is_reported_with_its_output():
    from skyrl_bridge_openenv.runtime import ServerError, ServerProcess

    started = time.monotonic()
    with pytest.raises(ServerError, match=r"exited with code 1 before it was ready:(.|\n)*no_such_module"):
        ServerProcess("no_such_module:Env", "x:A", "x:O", {}, start_timeout_s=30)
    assert time.monotonic() - started < 30


def test_url_mode_reads_the_action_fields_from_the_servers_schema():
    from skyrl_bridge_openenv.catalog import resolve
    from skyrl_bridge_openenv.env import OpenEnvEnv
    from skyrl_bridge_openenv.runtime import ServerProcess

    target = resolve(GUESS)
    server = ServerProcess(target.env_path, target.action_path, target.observation_path, {"high": 2}, 60)
    try:
        env = OpenEnvEnv(config={"name": "somebody-elses-guess-env", "mode": "url", "url": server.url,
                                 "max_turns": 7, "reward_range": (-0.7, 1.0)})
        prompt, _ = env.reset(seed=0)
        assert "guess (integer, required): Your guess" in prompt[0]["content"]
        assert env.step("two").info["invalid_action"]
        refused = env.step('{"guess": 5000}')  # fits the schema's type; the server's own validation refuses it
        assert refused.info["invalid_action"] and "refused" in refused.observation[0]["content"]
        result = env.step('{"guess": 1}')
        if not result.terminated:  # the target is 2
            result = env.step('{"guess": 2}')
        assert result.terminated and result.reward == 1.0
        env.close()
        assert server.exit_code() is None  # not ours to stop
        with pytest.raises(ValueError, match="env.args cannot reach a server"):
            OpenEnvEnv(config={"name": GUESS, "mode": "url", "url": server.url, "args": {"high": 5}}).reset(seed=0)
    finally:
        server.stop()
