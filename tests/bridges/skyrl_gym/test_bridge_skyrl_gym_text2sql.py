"""text2sql through the bridge on a tiny real SQLite database (conftest's ``sql_data``), SkyRL rows in JSONL and parquet.

A finding pinned here: skyrl-gym's text2sql checks the format over the whole history, the database's own
text included, so a correct solution after a query whose result holds '<solution>' scores the format penalty.
"""

from __future__ import annotations

import random

import pytest
from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_core.factory import env_class
from skyrl_core.testing import check_adversarial, check_env

THINK = "<think>Check the table.</think>\n"


def make(sql_data, row=0, **options):
    cls = env_class("skyrl_gym")
    config = SkyRLGymConfig(**{**sql_data["config"], **options})
    return cls(task=cls.load_dataset("train", config)[row], config=config)


def play(env, actions, seed=0):
    env.reset(seed=seed)
    steps = []
    for action in actions:
        steps.append(env.step(action))
        if steps[-1].terminated or steps[-1].truncated:
            break
    return steps


def test_text2sql_passes_check_env(sql_data):
    report = check_env("skyrl_gym", config=sql_data["config"], n_tasks=2)
    assert not report.failed and {"gold[row 1]", "gold[row 2]", "episode:formatted_wrong_then_gold"} <= set(report.passed)


def test_adversarial_quick_and_full_find_nothing_on_text2sql(sql_data):
    quick = check_adversarial("skyrl_gym", config=sql_data["config"], quick=True)
    assert quick.ok, quick.problems()
    full = check_adversarial("skyrl_gym", config=sql_data["config"])
    assert full.ok, full.problems()


def test_queries_run_then_the_solution_is_scored_against_the_gold_result(sql_data):
    env = make(sql_data)
    steps = play(env, [f"{THINK}<sql>SELECT name, stock FROM fruit</sql>",
                       f"{THINK}<solution>SELECT name FROM fruit WHERE stock < 1</solution>"])
    assert "plum" in steps[0].observation[0]["content"] and "4 turns left" in steps[0].observation[0]["content"]
    assert steps[0].reward == 0.0 and steps[0].info["skyrl_gym"]["tool_name"] == "sql"
    assert steps[1].terminated and steps[1].reward == 1.0
    assert play(env, [f"{THINK}<solution>SELECT name FROM fruit</solution>"])[-1].reward == 0.0
    assert play(env, ["<solution>SELECT name FROM fruit WHERE stock = 0</solution>"])[-1].reward == -1.0  # no <think>


def test_an_empty_last_reply_gets_the_peers_format_penalty(sql_data):
    env = make(sql_data, max_turns=2)
    steps = play(env, [f"{THINK}<sql>SELECT 1</sql>", ""])
    assert steps[-1].terminated and steps[-1].reward == -1.0 and "empty" in steps[-1].info["invalid_action"]
    first = play(env, [""])[0]  # not the last turn: the peer's own "invalid action" observation, no penalty yet
    assert first.reward == 0.0 and "Your previous action is invalid" in first.observation[0]["content"]


def test_finding_the_databases_text_feeds_the_format_check(sql_data):
    env = make(sql_data)
    steps = play(env, [f"{THINK}<sql>SELECT body FROM notes</sql>",
                       f"{THINK}<solution>SELECT name FROM fruit WHERE stock = 0</solution>"])
    assert "<solution>" in steps[0].observation[0]["content"]
    assert steps[-1].reward == -1.0  # the right query, scored as a broken format because of the data it read


def test_a_missing_database_is_one_clear_error_at_reset(sql_data, tmp_path):
    env = make(sql_data, args={"db_path": str(tmp_path / "nowhere")})
    with pytest.raises(RuntimeError, match=r"needs database files: .*spider/database/shop/shop.sqlite.*env.args.db_path"):
        env.reset(seed=0)
    report = check_env("skyrl_gym", config={**sql_data["config"], "args": {"db_path": str(tmp_path / "nowhere")}},
                       n_tasks=1, raise_on_failure=False)
    assert report.bad_rows and "needs database files" in report.failed[0]


def test_rows_are_checked_naming_the_row_number(sql_data, tmp_path, rows_io):
    sql_row, write_jsonl = rows_io.sql_row, rows_io.write_jsonl
    rows = [*sql_data["rows"], {**sql_row("Q?", "SELECT 1", "third"), "env_class": "gsm8k"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    cls = env_class("skyrl_gym")
    with pytest.raises(ValueError, match=r"mixed.jsonl: row 3: its env_class is 'gsm8k' but env.name is 'text2sql'"):
        cls.load_dataset("train", SkyRLGymConfig(name="text2sql", data_files={"train": str(path)}))
    no_db = {k: v for k, v in sql_row("Q?", "SELECT 1", "x").items() if k != "db_id"}
    path = write_jsonl(tmp_path / "nodb.jsonl", [no_db])
    with pytest.raises(ValueError, match=r"row 1: it has no 'db_id'"):
        cls.load_dataset("train", SkyRLGymConfig(name="text2sql", data_files={"train": str(path)}))
    with pytest.raises(ValueError, match="has no split 'test'"):
        cls.load_dataset("test", SkyRLGymConfig(**sql_data["config"]))


def test_parquet_rows_load_like_skyrls(sql_data, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{**row, "extra_info": {"index": i}} for i, row in enumerate(sql_data["rows"])]  # parquet: no empty structs
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    config = {**sql_data["config"], "data_files": {"train": str(tmp_path / "train.parquet")}}
    loaded = env_class("skyrl_gym").load_dataset("train", SkyRLGymConfig(**config))
    assert [row["id"] for row in loaded] == ["out-of-stock", "cheap"] and loaded[0]["prompt"][1]["role"] == "user"
    assert not check_env("skyrl_gym", config=config, n_tasks=1).failed


def test_text2sql_draws_no_random_numbers(sql_data):
    random.seed(5)
    before = random.getstate()
    env = make(sql_data)
    play(env, [f"{THINK}<sql>SELECT * FROM fruit</sql>", *env.gold_actions()])
    assert random.getstate() == before
