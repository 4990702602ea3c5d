"""The catalogue and the config: what `skyrl envs --catalog skyrl_gym` lists, and the errors a bad choice gets."""

from __future__ import annotations

import pytest
import skyrl_gym
from pydantic import ValidationError
from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_core.catalog import catalog_entries
from skyrl_core.factory import env_class


def test_the_catalogue_lists_every_env_skyrl_gym_registers():
    entries = {entry.name: entry for entry in catalog_entries("skyrl_gym")}
    assert set(entries) == set(skyrl_gym.registry) >= {"gsm8k", "gsm8k_multi_turn", "text2sql", "search", "aime",
                                                       "lcb", "searchcode"}
    assert not entries["gsm8k"].multi_turn and entries["gsm8k"].reward_range == (0.0, 1.0)
    multi = entries["gsm8k_multi_turn"]
    assert multi.multi_turn and multi.max_turns == 5 and multi.reward_range[1] == pytest.approx(1.16)
    assert "format bonus accumulates over turns" in multi.tags
    assert entries["text2sql"].reward_range == (-1.0, 1.0) and "needs database files" in entries["text2sql"].tags
    assert "db_path" in entries["text2sql"].description
    assert "needs retrieval server" in entries["search"].tags and "search_url" in entries["search"].description
    assert entries["searchcode"].tags == ("unsupported",) and "unsandboxed" in entries["searchcode"].description


def test_max_turns_defaults_to_the_peer_envs_own():
    assert SkyRLGymConfig().max_turns == 1
    assert SkyRLGymConfig(name="gsm8k_multi_turn").max_turns == 5
    assert SkyRLGymConfig(name="text2sql").max_turns == 5 and SkyRLGymConfig(name="search").max_turns == 2
    assert SkyRLGymConfig(name="gsm8k_multi_turn", max_turns=3).max_turns == 3


def test_the_reward_range_follows_the_named_env_and_its_turns():
    cls = env_class("skyrl_gym")
    assert cls.reward_range_for(SkyRLGymConfig(name="text2sql")) == (-1.0, 1.0)
    assert cls.reward_range_for(SkyRLGymConfig(name="aime")) == (-1.0, 1.0)
    assert cls.reward_range_for(SkyRLGymConfig(name="gsm8k_multi_turn", max_turns=3))[1] == pytest.approx(1 + 0.2 * 2 / 3)
    assert cls.reward_range_for(SkyRLGymConfig(name="gsm8k_multi_turn", max_turns=1)) == (0.0, 1.0)
    assert cls.reward_range_for(SkyRLGymConfig(name="text2sql", reward_range=(-2, 2))) == (-2, 2)


@pytest.mark.parametrize(("options", "words"), [
    ({"name": "nope"}, ["'nope'", "gsm8k_multi_turn", "text2sql"]),
    ({"name": "searchcode"}, ["not supported", "unsandboxed"]),
    ({"name": "lcb"}, ["not supported", "exec()", "skyrl-sandbox"]),  # model code would run in the trainer
    ({"name": "text2sql", "args": {"db": "/x"}}, ["'db'", "db_path"]),
    ({"name": "gsm8k", "args": {"topk": 3}}, ["'topk'", "none"]),
])
def test_a_bad_choice_is_one_clear_error(options, words):
    with pytest.raises(ValidationError) as caught:
        SkyRLGymConfig(**options)
    for word in words:
        assert word in str(caught.value)


def test_envs_without_built_in_rows_say_what_to_give():
    cls = env_class("skyrl_gym")
    with pytest.raises(ValueError, match=r"env.data_files.train=PATH.*db_path"):
        cls.load_dataset("train", SkyRLGymConfig(name="text2sql"))
