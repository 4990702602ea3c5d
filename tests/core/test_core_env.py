"""TextEnv's Gymnasium contract, the reward helper, gymnasium.make, and trajectory records."""

from __future__ import annotations

import asyncio
import json
import pickle

import gymnasium
import pytest
from skyrl_core import EnvConfig, RewardFn, Rubric, StepResult, TextEnv, Trajectory, TrajectoryBatch, Turn
from skyrl_core.trajectory import read_jsonl


class EchoEnv(TextEnv):
    def take_action(self, action):
        if action == "boom":
            raise OSError("disk full")
        return StepResult([{"role": "user", "content": action.upper()}], 0.5, action == "stop", False, {})


class AsyncEnv(TextEnv):
    async def atake_action(self, action):
        await asyncio.sleep(0)
        return StepResult([], 1.0, True, False, {"async": True})


def make(env_cls=EchoEnv, **config):
    env = env_cls(task={"prompt": "hi"}, config={"max_turns": 3, **config})
    env.reset(seed=0)
    return env


def test_reset_returns_messages_and_info():
    obs, info = EchoEnv(task={"prompt": "hello"}).reset(seed=1)
    assert obs == [{"role": "user", "content": "hello"}] and info == {"max_turns": 1}


def test_task_can_come_through_reset_options():
    env = EchoEnv()
    obs, _ = env.reset(options={"task": {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}})
    assert [m["role"] for m in obs] == ["system", "user"]


def test_missing_prompt_names_the_field():
    with pytest.raises(ValueError, match="task has no 'prompt'"):
        EchoEnv(task={}).reset()


def test_step_returns_the_gymnasium_five_tuple():
    obs, reward, terminated, truncated, info = make().step("go")
    assert obs == [{"role": "user", "content": "GO"}] and reward == 0.5
    assert (terminated, truncated, info) == (False, False, {})


@pytest.mark.parametrize("action, message", [("", "empty"), ("   ", "empty"), (None, "must be text"),
                                             ("x" * 101, "101 characters; the limit is 100")])
def test_bad_actions_get_an_observation_not_an_exception(action, message):
    result = make(max_action_chars=100).step(action)
    assert message in result.observation[0]["content"] and result.reward == 0.0
    assert not result.terminated and "invalid_action" in result.info


class PenalisingEnv(EchoEnv):
    """Scores a rejected action with its own penalty, as an env with a format penalty does."""

    reward_range = (-1.0, 1.0)

    def reject_action(self, problem):
        return StepResult([{"role": "user", "content": f"Penalised: {problem}"}], -1.0, False, False,
                          {"problem": problem})


@pytest.mark.parametrize("use_astep", [False, True])
@pytest.mark.parametrize("action, message", [("", "empty"), (" \n", "empty"), (None, "must be text"),
                                             ("x" * 101, "101 characters; the limit is 100")])
def test_rejected_actions_reach_the_envs_reject_action(action, message, use_astep):
    env = make(PenalisingEnv, max_action_chars=100)
    play = (lambda a: asyncio.run(env.astep(a))) if use_astep else env.step
    result = play(action)
    assert result.reward == -1.0 and message in result.info["problem"]
    assert result.observation == [{"role": "user", "content": f"Penalised: {result.info['problem']}"}]
    assert not (result.terminated or result.truncated)
    play("a")
    last = play(action)  # turn 3 of 3: the env's penalty still applies and the turn limit still truncates
    assert (last.reward, last.terminated, last.truncated) == (-1.0, False, True)
    assert last.info["truncated_reason"] == "turn limit (3) reached"


def test_by_default_a_rejected_action_at_the_turn_limit_scores_0_and_truncates():
    env = make(max_turns=1)
    result = env.step("")
    assert (result.reward, result.terminated, result.truncated) == (0.0, False, True)
    assert "empty" in result.observation[0]["content"] and "invalid_action" in result.info


def test_an_exception_in_reject_action_ends_the_episode_with_an_error():
    class Broken(EchoEnv):
        def reject_action(self, problem):
            raise KeyError("no scorer")

    result = make(Broken).step("")
    assert result.truncated and result.info["error"] == "KeyError: 'no scorer'"


def test_turn_limit_truncates():
    env = make()
    results = [env.step("a") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].info["truncated_reason"] == "turn limit (3) reached"
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("a")


def test_an_env_exception_ends_the_episode_with_an_error():
    result = make().step("boom")
    assert result.truncated and not result.terminated and result.observation == []
    assert result.info["error"] == "OSError: disk full" and "Traceback" in result.info["traceback"]


def test_astep_runs_sync_envs_in_a_thread_and_async_envs_natively():
    assert asyncio.run(make().astep("stop"))[:4] == ([{"role": "user", "content": "STOP"}], 0.5, True, False)
    assert asyncio.run(make(AsyncEnv).astep("x")).info == {"async": True}
    assert make(AsyncEnv).step("x").reward == 1.0  # the sync form works for async-only envs too


def test_config_rejects_unknown_keys():
    with pytest.raises(Exception, match="max_turn"):
        EchoEnv(config={"max_turn": 3})


def test_env_pickles_for_remote_workers():
    env = make()
    clone = pickle.loads(pickle.dumps(env))
    assert clone.config == env.config and clone.task == env.task


def test_gymnasium_make_under_the_skyrl_namespace():
    env = gymnasium.make("skyrl_core.gym:skyrl/reverse_text-v0", task={"text": "abc"})
    obs, _ = env.reset(seed=0)
    assert obs[-1] == {"role": "user", "content": "abc"}
    assert env.step("<answer>cba</answer>")[1:3] == (1.0, True)


def test_rubric_weights_components_and_reports_them():
    rubric = Rubric(RewardFn("correct", lambda answer, gold: float(answer == gold)),
                    RewardFn("short", lambda answer, gold: float(len(answer) < 5), weight=0.1))
    total, parts = rubric.score(answer="abc", gold="abc")
    assert total == pytest.approx(1.1) and parts == {"correct": 1.0, "short": 1.0}
    assert rubric.score(answer="abcdef", gold="x") == (0.0, {"correct": 0.0, "short": 0.0})
    with pytest.raises(ValueError, match="unique"):
        Rubric(RewardFn("a", len), RewardFn("a", len))


def test_trajectory_tree_round_trips_through_jsonl(tmp_path):
    root = Trajectory(prompt_ids=[1, 2], response_ids=[3, 4, 5], loss_mask=[1, 0, 1], logprobs=[-0.1, 0.0, -0.2],
                      policy_versions=[2, -1, 3], reward=1.0, turns=[Turn("a", [{"role": "user", "content": "o"}], 1.0, {"k": 1})],
                      stop_reason="terminated", group_id="g")
    child = Trajectory(parent_id=root.id, depth=1, group_id="g", reward=0.5)
    batch = TrajectoryBatch([root, child])
    path = tmp_path / "t.jsonl"
    batch.to_jsonl(path)
    loaded = TrajectoryBatch.from_jsonl(path)
    assert loaded.trajectories == [root, child]
    assert loaded.roots() == [root] and loaded.children_of(root.id) == [child]
    assert loaded.trajectories[0].rewards == [1.0]
    assert loaded.trajectories[0].policy_versions == [2, -1, 3] and loaded.trajectories[0].oldest_policy_version == 2
    # each record carries the trajectory-level token_source and trainable, derived from its turns
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["token_source"], r["trainable"]) for r in records] == [("exact", True), ("exact", True)]
    chat = Trajectory(turns=[Turn("a", [], token_source="exact"), Turn("b", [], token_source="text")])
    assert (chat.to_dict()["token_source"], chat.to_dict()["trainable"]) == ("text", False)
    assert Trajectory.from_dict(chat.to_dict()) == chat


def test_records_written_before_policy_versions_existed_still_load(tmp_path):
    path = tmp_path / "old.jsonl"
    record = Trajectory(response_ids=[3, 4], loss_mask=[1, 1], logprobs=[-0.1, -0.2]).to_dict()
    del record["policy_versions"]
    path.write_text(json.dumps(record) + "\n")
    (loaded,) = TrajectoryBatch.from_jsonl(path)
    assert loaded.policy_versions == [] and loaded.oldest_policy_version is None


def test_malformed_trajectory_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"reward": 1.0}\n{"rewrd": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*rewrd"):
        list(read_jsonl(path))


def test_env_config_defaults():
    assert EnvConfig().max_turns == 1
