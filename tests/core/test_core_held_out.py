"""Held-out evaluation defaults shared by training and ``skyrl rollout``: the split an env declares held out,
the env's run_defaults as a rollout's lowest layer, and the ``eval/*`` numbers of an evaluation."""

from __future__ import annotations

import pytest
from skyrl_core import EnvSpec, hookimpl
from skyrl_core.config import build_config
from skyrl_core.held_out import (
    default_split,
    eval_reward_line,
    eval_summary,
    held_out_metrics,
    held_out_split,
    rollout_defaults,
)
from skyrl_core.trajectory import Trajectory, TrajectoryBatch


class SplitEnvs:
    @hookimpl
    def register_envs(self, register):
        entry = "skyrl_reverse_text.env:ReverseTextEnv"
        register(EnvSpec(id="curriculum", entry_point=entry, eval_splits={"easy": "easy_test", "train": "dev"},
                         run_defaults={"env": {"max_turns": 3},
                                       "generator": {"temperature": 0.7, "n_samples_per_prompt": 8},
                                       "trainer": {"data_split": "easy", "steps": 12}}))
        register(EnvSpec(id="conventional", entry_point=entry))
        register(EnvSpec(id="one_split", entry_point=entry, eval_splits={}))


@pytest.fixture
def registry(skyrl_plugin_manager, register_skyrl_plugin):
    register_skyrl_plugin(SplitEnvs())
    return skyrl_plugin_manager.registry


def test_the_held_out_split_is_declared_per_training_split(registry):
    curriculum = registry.get("env", "curriculum")
    assert held_out_split(curriculum, "easy") == "easy_test" and held_out_split(curriculum, "train") == "dev"
    assert held_out_split(curriculum, "other") == "other"  # not listed: evaluated on itself
    assert held_out_split(registry.get("env", "conventional"), "train") == "test"  # TextEnv's convention
    assert held_out_split(registry.get("env", "one_split"), "train") == "train"
    assert registry.get("env", "curriculum").metadata()["eval_splits"] == {"easy": "easy_test", "train": "dev"}


def test_a_rollout_defaults_to_the_split_a_run_of_the_env_evaluates_on(registry):
    def split(*layers):
        return default_split([{"env": {"id": "curriculum"}}, *layers], registry)

    assert split() == ("easy_test", "curriculum's held-out split for training split 'easy'")  # run_defaults' split
    assert split({"trainer": {"data_split": "train"}})[0] == "dev"
    assert split({"trainer": {"data_split": "train", "eval_split": "mine"}}) == ("mine", "trainer.eval_split")
    assert split({"trainer": {"data_split": "hard"}}) == ("hard", "curriculum evaluates training split 'hard' on itself")
    assert default_split([{"env": {"id": "conventional"}}], registry)[0] == "test"


def test_a_rollout_takes_the_env_run_defaults_but_not_the_training_group_size(registry):
    layers = [{"env": {"id": "curriculum"}, "engine": {"id": "openai"}}]
    defaults = rollout_defaults(layers, registry)
    assert defaults == {"env": {"max_turns": 3}, "generator": {"temperature": 0.7}}  # no trainer section either
    cfg = build_config(defaults, *layers, registry=registry, need_trainer=False)
    assert cfg.env.max_turns == 3 and cfg.generator.temperature == 0.7
    assert "n_samples_per_prompt" not in cfg.generator.model_fields_set  # so --samples defaults to 1
    assert rollout_defaults([{"env": {"id": "conventional"}}], registry) == {}


def episode(group: str, reward: float, error: str | None = None, parent: str | None = None) -> Trajectory:
    return Trajectory(group_id=group, reward=reward, error=error, parent_id=parent)


def test_eval_metrics_rename_the_rollout_numbers_and_count_solved_episodes():
    batch = TrajectoryBatch([episode("a", 1.0), episode("b", 0.2), episode("c", 1.0, error="sandbox died"),
                             episode("d", 1.0 - 1e-9), episode("a", 1.0, parent="x")])  # a child is no episode
    batch.metrics = {"reward/mean": 0.8, "reward/std": 0.3, "rollout/errors": 1.0, "rollout/turns_mean": 1.5,
                     "env/task_reward": 0.5, "rlm/depth0/episodes": 4.0}
    metrics = held_out_metrics(batch, (0.0, 1.0))
    assert metrics == {"eval/reward_mean": 0.8, "eval/reward_std": 0.3, "eval/errors": 1.0, "eval/turns_mean": 1.5,
                       "eval/env/task_reward": 0.5, "eval/rlm/depth0/episodes": 4.0,
                       "eval/pass_rate": 0.5, "eval/tasks": 4.0}  # a and d solved; c errored
    assert held_out_metrics(TrajectoryBatch([episode("a", 1.0)]), (-1.0, 2.0))["eval/pass_rate"] == 0.0


def test_the_summary_line_compares_the_first_and_last_evaluation():
    records = [(0, {"eval/reward_mean": 0.125, "eval/pass_rate": 0.0}), (4, {"eval/reward_mean": 0.2}),
               (12, {"eval/reward_mean": 0.3125, "eval/pass_rate": 0.25})]
    summary = eval_summary(records)
    assert summary == {"eval/step_first": 0.0, "eval/step_last": 12.0, "eval/reward_mean_first": 0.125,
                       "eval/reward_mean_last": 0.3125, "eval/pass_rate_first": 0.0, "eval/pass_rate_last": 0.25}
    assert eval_reward_line(summary) == "eval reward: 0.125 -> 0.312 (step 0 -> step 12); pass rate: 0.000 -> 0.250"
    assert eval_summary([]) == {} and eval_reward_line({"reward/first": 0.1}) is None


SHIPPED = {"rlm_repl": "skyrl_rlm_repl", "sql": "skyrl_sql", "search": "skyrl_search",
           "harbor_terminal": "skyrl_harbor_terminal", "reverse_text": "skyrl_reverse_text"}


@pytest.mark.parametrize("env_id", sorted(SHIPPED))
def test_every_shipped_env_declares_a_held_out_split_that_loads(env_id, skyrl_plugin_manager):
    pytest.importorskip(SHIPPED[env_id])
    from skyrl_core.factory import component_config, env_class

    registry = skyrl_plugin_manager.registry
    spec = registry.get("env", env_id)
    train = spec.run_defaults.get("trainer", {}).get("data_split", "train")
    cls = env_class(env_id, registry)
    config = component_config("env", env_id, {}, registry)
    split = held_out_split(spec, train)
    held_out = list(cls.load_dataset(split, config))
    assert held_out, f"{env_id}: split {split!r} is empty"
    if split != train:  # really held out: no task of the training split
        train_ids = {row["id"] for row in cls.load_dataset(train, config)}
        assert all("id" in row for row in held_out) and not {row["id"] for row in held_out} & train_ids
