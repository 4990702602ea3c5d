"""The env end to end: prompts, observations, limits in observations, metrics, registry, check_env."""

from __future__ import annotations

import pickle

import pytest
from skyrl_core import get_registry, make_env
from skyrl_core.factory import ConfigError
from skyrl_core.testing import check_env
from skyrl_sql.env import SQLEnv
from skyrl_sql.render import INVALID_ACTION
from sql_helpers import ENGINES, THINK, query, started_env, task


@pytest.mark.parametrize("engine", ENGINES)
def test_check_env_passes(engine):
    report = check_env("sql", config={"engine": engine}, n_tasks=3)
    assert not report.failed
    assert {"pickle", "turn_limit", "determinism", "action:empty_at_turn_limit", "gold[row 3]"} <= set(report.passed)


def test_registered_with_its_metadata():
    spec = get_registry().get("env", "sql")
    assert spec.provider.name == "skyrl-sql"
    assert spec.reward_range == (-1.0, 1.0)
    assert isinstance(make_env("sql", task(), {"max_turns": 3}), SQLEnv)


def test_config_typos_are_named():
    with pytest.raises(ConfigError, match="env.engin: unknown key. Did you mean 'engine'"):
        make_env("sql", task(), {"engin": "duckdb"})
    with pytest.raises(ConfigError, match="env.engine"):
        make_env("sql", task(), {"engine": "postgres"})


@pytest.mark.parametrize(("engine", "name"), [("sqlite", "SQLite"), pytest.param(*ENGINES[1].values, "DuckDB",
                                                                                   marks=ENGINES[1].marks)])
def test_prompt_states_engine_rules_schema_and_question(engine, name):
    env = SQLEnv(task(), {"engine": engine})
    messages, info = env.reset(seed=0)
    system, user = messages
    assert system["role"] == "system" and f"Database Engine: {name}" in system["content"]
    for rule in ("<sql>", "<solution>", "<think>", "<observation>", "at most 5 turns", "50 rows", "penalty"):
        assert rule in system["content"]
    assert "CREATE TABLE employees" in user["content"].replace('"', "")
    assert user["content"].endswith(f"Question: {task()['question']}")
    assert info["max_turns"] == 5


def test_a_skyrl_sql_row_keeps_its_own_prompt():
    prompt = [{"role": "system", "content": "Custom system"}, {"role": "user", "content": "{db_details}: ..."}]
    env = SQLEnv({**task(), "prompt": prompt})
    assert env.reset(seed=0)[0] == prompt


@pytest.mark.parametrize("engine", ENGINES)
def test_multi_turn_episode_shows_real_results_then_scores(engine):
    env = started_env(engine)
    text = query(env, "SELECT name, city FROM departments WHERE id <= 2 ORDER BY id")
    assert text.startswith("\n<observation>")
    assert text.endswith("\n<reminder>You have 4 turns left to complete the task.</reminder></observation>\n")
    lines = text.split("\n")
    assert lines[1].split() == ["<observation>", "name", "city"]
    assert "Engineering" in lines[2] and "Berlin" in lines[2] and "Sales" in lines[3]
    result = env.step(f"{THINK}<solution>SELECT COUNT(*) FROM employees</solution>")
    assert (result.reward, result.terminated, result.observation) == (1.0, True, [])
    metrics = env.get_metrics()
    assert metrics == {"turns": 2.0, "execution_errors": 0.0, "invalid_turns": 0.0, "format_ok": 1.0,
                       "execution_match": 1.0, "exact_match": 1.0, "submitted": 1.0,
                       "sandbox_strong": float(env.backend == "bwrap")}
    assert env.backend in ("bwrap", "subprocess") and result.info["sandbox_backend"] == env.backend


def test_errors_are_shown_without_the_server_path_and_counted():
    env = started_env()
    text = query(env, "SELECT * FROM nope")
    assert "Error executing SQL: no such table: nope" in text
    assert str(env.database()) not in text
    assert env.get_metrics()["execution_errors"] == 1


def test_a_turn_without_sql_gets_the_invalid_action_observation():
    env = started_env()
    result = env.step("I think the answer is 60.")
    assert INVALID_ACTION in result.observation[0]["content"]
    assert result.info["query_status"] == "invalid"
    assert env.get_metrics()["invalid_turns"] == 1


def test_only_the_first_sql_block_of_a_turn_runs():
    env = started_env()
    text = query(env, "SELECT 'first'</sql> then <sql>SELECT 'second'")
    assert "first" in text and "second" not in text


def test_long_results_show_50_rows_and_say_so():
    env = started_env()
    text = query(env, "SELECT id FROM employees ORDER BY id")
    assert "Showing the first 50 of 60 rows." in text
    assert "\n50\n" in text and "\n51\n" not in text


def test_wide_results_are_cut_to_the_observation_size_cap():
    env = started_env(max_observation_chars=500)
    text = query(env, "SELECT * FROM employees")
    assert "Showing the first" in text
    assert len(text) < 500 + 300


def test_empty_results_say_so():
    assert "The query returned no rows." in query(started_env(), "SELECT * FROM employees WHERE 1 = 0")


def test_reset_starts_a_clean_episode():
    env = started_env()
    query(env, "SELECT * FROM nope")
    env.reset(seed=0)
    assert env.get_metrics()["execution_errors"] == 0 and env.actions == []


def test_env_pickles_mid_episode_and_keeps_working():
    env = started_env()
    query(env, "SELECT 1")
    clone = pickle.loads(pickle.dumps(env))
    assert clone.step(f"{THINK}<solution>SELECT COUNT(*) FROM employees</solution>").reward == 1.0


def test_a_missing_database_is_named_with_the_paths_tried(tmp_path):
    env = SQLEnv({**task(), "data": "spider", "db_id": "absent"}, {"db_root": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="database 'absent' not found for engine sqlite; tried:"):
        env.reset(seed=0)
