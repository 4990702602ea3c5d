"""Reward rules: SkyRL-SQL's format check and the execution-result comparison."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from skyrl_sql.data.builtin import builtin_rows
from skyrl_sql.env import SQLEnv
from skyrl_sql.reward import normalize_sql, orders_result, results_match
from skyrl_sql.tags import FormatCheck, check_format
from sql_helpers import ENGINES, THINK, query, started_env, task


@pytest.mark.parametrize(("predicted", "gold", "ordered", "duplicates", "expected"), [
    ([(1,), (2,)], [(2,), (1,)], False, "ignore", True),
    ([(1,), (2,)], [(2,), (1,)], True, "ignore", False),
    ([(1,), (2,)], [(1,), (2,)], True, "ignore", True),
    ([(1,), (1,), (2,)], [(1,), (2,)], False, "ignore", True),
    ([(1,), (1,), (2,)], [(1,), (2,)], False, "count", False),
    ([(3,)], [(3.0,)], False, "ignore", True),
    ([(0.1 + 0.2,)], [(0.3,)], False, "ignore", True),
    ([(True,)], [(1,)], False, "ignore", True),
    ([("3",)], [(3,)], False, "ignore", False),
    ([(1, "a")], [("a", 1)], False, "ignore", False),
    ([(None,)], [(None,)], False, "ignore", True),
    ([(3.0001,)], [(3.0,)], False, "ignore", False),
    ([], [], False, "ignore", True),
])
def test_results_match(predicted, gold, ordered, duplicates, expected):
    assert results_match(predicted, gold, ordered=ordered, duplicates=duplicates) is expected


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT a FROM t ORDER BY a", True),
    ("select a from t order  by a desc limit 3", True),
    ("SELECT a FROM (SELECT a FROM t ORDER BY a) AS s", False),
    ("SELECT a FROM t WHERE b = 'order by'", False),
    ("SELECT a FROM t -- order by a", False),
    ("SELECT COUNT(*) FROM t", False),
    ('SELECT "order by" FROM t', False),
])
def test_orders_result_looks_at_the_outermost_query_only(sql, expected):
    assert orders_result(sql) is expected


def test_normalize_sql_for_exact_match():
    assert normalize_sql("SELECT  a\nFROM t;") == normalize_sql("select a from t")


@pytest.mark.parametrize(("actions", "problem"), [
    (["<think>x</think><solution>SELECT 1</solution>"], ""),
    (["<think>x</think><solution>SELECT 1</solution><solution>SELECT 2</solution>"], "exactly one"),
    (["<think>x</think><solution>SELECT 1"], "exactly one"),
    (["<think>x</think></solution>SELECT 1<solution>"], "comes before"),
    (["<think>x</think><solution><sql>SELECT 1</sql></solution>"], "may not contain"),
    (["<think>x</think><solution>  </solution>"], "empty"),
    (["<solution>SELECT 1</solution>"], "no <think>"),
    (["<think>a</think><sql>SELECT 1</sql>", "<solution>SELECT 1</solution>"], "does not start with <think>"),
    (["<think>a</think><sql>SELECT 1</sql>", " <think>b</think><solution>SELECT 1</solution>"], ""),
    (["<think>a</think><solution>SELECT 1", "<think>b</think></solution>"], "exactly one"),  # spans a turn
    # each action is read on its own, and the text of its <sql> block is the query, never format
    (["<think>a</think><sql>SELECT '</observation>'</sql>", "<think>b</think><solution>SELECT 1</solution>"], ""),
    (["<think>a</think><sql>SELECT '<solution>'</sql>", "<think>b</think><solution>SELECT 1</solution>"], ""),
    (["<think>a</think><sql>x</sql></observation>", "<think>b</think><solution>SELECT 1</solution>"], ""),
    (["<think>a</think><sql>x</sql><solution>", "<think>b</think><solution>SELECT 1</solution>"], "exactly one"),
    (["<sql>SELECT '<think>a</think>'</sql>", "<solution>SELECT 1</solution>"], "no <think>"),
    (["<think>a</think><sql>x</sql>", "<sql>SELECT '<think>'</sql><think>b</think><solution>SELECT 1</solution>"],
     "does not start with <think>"),
])
def test_format_rules(actions, problem):
    check = check_format(actions)
    assert check.ok is (problem == "")
    assert problem in check.problem
    if check.ok:
        assert check.solution == "SELECT 1"


@pytest.mark.parametrize("solution", ["SELECT COUNT(*) FROM t WHERE b LIKE '%</observation>%'",
                                      'SELECT 1 AS "<think>x</think>"', "SELECT '<sql>' || '</sql>'",
                                      "SELECT '<sql>'"])
def test_tags_in_the_solution_s_literals_are_the_query_s_own(solution):
    assert check_format([f"<think>a</think><solution>{solution}</solution>"]) == FormatCheck(True, solution)
    assert not check_format([f"<solution>{solution}</solution>"]).ok  # a <think> in a literal is no reasoning
    after = check_format([f"<think>a</think><solution>{solution}</solution> <sql>SELECT 2</sql>"])
    assert (after.ok, after.solution) == (True, solution)  # the <sql> inside the solution opens no block


def test_think_rule_can_be_switched_off():
    assert check_format(["<solution>SELECT 1</solution>"], require_think=False).ok


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_gold_sql_of_every_builtin_question_scores_1(engine, split):
    for row in builtin_rows(split):
        env = SQLEnv(row, {"engine": engine})
        env.reset(seed=0)
        result = env.step(env.gold_actions()[0])
        assert (result.reward, result.terminated) == (1.0, True), (row["id"], result.info)
        assert env.get_metrics()["execution_match"] == 1.0
        assert env.get_metrics()["exact_match"] == 1.0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_wrong_query_scores_0_and_says_why(engine):
    env = started_env(engine)
    result = env.step(f"{THINK}<solution>SELECT COUNT(*) FROM departments</solution>")
    assert (result.reward, result.terminated) == (0.0, True)
    assert result.info["reward_components"] == {"format": 1.0, "execution_match": 0.0}
    assert result.info["why"] == "the result differs from the gold result"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_different_but_equivalent_query_scores_1_without_exact_match(engine):
    env = started_env(engine)  # gold: SELECT COUNT(*) FROM employees
    result = env.step(f"{THINK}<solution>SELECT COUNT(id) + 0.0 FROM employees e WHERE 1 = 1</solution>")
    assert result.reward == 1.0
    assert env.get_metrics()["exact_match"] == 0.0


def test_a_failing_solution_scores_0():
    env = started_env()
    result = env.step(f"{THINK}<solution>SELECT nope FROM employees</solution>")
    assert result.reward == 0.0
    assert "the submitted query failed (error): no such column: nope" in result.info["why"]


def test_a_writing_solution_scores_0():
    env = started_env()
    result = env.step(f"{THINK}<solution>DELETE FROM employees</solution>")
    assert result.reward == 0.0
    assert "refused" in result.info["why"]


def test_a_malformed_turn_gets_the_format_penalty():
    env = started_env()
    result = env.step("<solution>SELECT COUNT(*) FROM employees</solution>")  # right answer, no <think>
    assert (result.reward, result.terminated) == (-1.0, True)
    assert result.info["reward_components"] == {"format": 0.0, "execution_match": 0.0}
    assert "no <think>" in result.info["why"]


def test_format_penalty_is_configurable():
    env = started_env(format_penalty=-0.5)
    assert env.step("<solution>SELECT 1</solution><solution>").reward == -0.5


def test_running_out_of_turns_without_a_solution_gets_the_format_penalty():
    env = started_env(max_turns=2)
    first = env.step(f"{THINK}<sql>SELECT 1</sql>")
    last = env.step(f"{THINK}<sql>SELECT 2</sql>")
    assert first.reward == 0.0 and not (first.terminated or first.truncated)
    assert (last.reward, last.terminated, last.truncated) == (-1.0, False, True)
    assert env.get_metrics()["submitted"] == 0.0


def test_skipping_think_after_an_observation_is_a_format_error():
    env = started_env()
    env.step(f"{THINK}<sql>SELECT COUNT(*) FROM employees</sql>")
    result = env.step("<solution>SELECT COUNT(*) FROM employees</solution>")
    assert result.reward == -1.0
    assert "does not start with <think>" in result.info["why"]


def test_duplicates_count_mode_is_stricter():
    row = {**task(), "reward_spec": {"ground_truth": "SELECT DISTINCT city FROM departments"}}
    assert started_env(row=row).step(f"{THINK}<solution>SELECT city FROM departments</solution>").reward == 1.0
    strict = started_env(row=row, duplicates="count")
    assert strict.step(f"{THINK}<solution>SELECT city FROM departments</solution>").reward == 0.0


def test_row_order_matters_only_when_the_gold_query_orders():
    ordered = {**task(), "reward_spec": {"ground_truth": "SELECT name FROM departments ORDER BY name"}}
    unordered = {**task(), "reward_spec": {"ground_truth": "SELECT name FROM departments"}}
    reverse = f"{THINK}<solution>SELECT name FROM departments ORDER BY name DESC</solution>"
    assert started_env(row=ordered).step(reverse).reward == 0.0
    assert started_env(row=unordered).step(reverse).reward == 1.0


def test_a_broken_gold_query_ends_the_episode_as_an_infrastructure_error():
    row = {**task(), "reward_spec": {"ground_truth": "SELECT missing FROM nowhere"}}
    result = started_env(row=row).step(f"{THINK}<solution>SELECT 1</solution>")
    assert result.truncated and "gold SQL of task" in result.info["error"]


# -- results with many rows ---------------------------------------------------------------------------

EVENTS = 50_000
EVENTS_TASK = {"id": "events-0", "db_id": "events", "question": "List every event.",
               "reward_spec": {"ground_truth": "SELECT id, name FROM events"}}


@pytest.fixture(scope="module")
def events_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<root>/events/events.sqlite``: one table of 50,000 rows (five times the generic frame's list limit)."""
    root = tmp_path_factory.mktemp("events")
    (root / "events").mkdir()
    conn = sqlite3.connect(root / "events" / "events.sqlite")
    conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO events VALUES (?, ?)", ((i, f"event, [{i}]") for i in range(EVENTS)))
    conn.commit()
    conn.close()
    return root


def events_env(root: Path, row: dict = EVENTS_TASK, **options) -> SQLEnv:
    env = SQLEnv(row, {"db_root": str(root), **options})
    env.reset(seed=0)
    return env


def test_a_gold_query_of_50_000_rows_scores_an_equivalent_query_1(events_root):
    result = events_env(events_root).step(f"{THINK}<solution>SELECT id, name FROM events ORDER BY id DESC</solution>")
    assert (result.reward, result.terminated, result.info.get("error")) == (1.0, True, None)
    assert result.info["reward_components"] == {"format": 1.0, "execution_match": 1.0}


def test_results_over_the_row_caps_are_reported_as_cut_not_as_crashes(events_root):
    env = events_env(events_root, max_rows=20_000, reward_max_rows=20_000)
    assert "Row limit hit: the query returned more than 20,000 rows and was cut off." in query(
        env, "SELECT id, name FROM events")
    result = env.step(f"{THINK}<solution>SELECT id, name FROM events</solution>")
    assert result.truncated and "events-0 cannot be scored (ok, rows cap hit)" in result.info["error"]
    small_gold = {**EVENTS_TASK, "reward_spec": {"ground_truth": "SELECT id FROM events WHERE id < 10"}}
    scored = events_env(events_root, small_gold, reward_max_rows=20_000).step(
        f"{THINK}<solution>SELECT id FROM events</solution>")
    assert scored.reward == 0.0 and scored.info["why"] == "the submitted query's result exceeded the rows cap"
