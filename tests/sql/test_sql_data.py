"""Built-in data generation and the Spider / BIRD / SynSQL / SkyRL-SQL loaders."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from skyrl_core.data import DataError
from skyrl_sql.config import SQLEnvConfig
from skyrl_sql.data.builtin import builtin_rows, ensure_builtin_databases
from skyrl_sql.data.loaders import DatasetError, load_questions, resolve_database
from skyrl_sql.data.questions import QUESTIONS
from skyrl_sql.env import SQLEnv
from sql_helpers import HAS_DUCKDB, THINK, folder_digest


def test_builtin_splits_cover_every_question_once_with_all_difficulties():
    train, test = builtin_rows("train"), builtin_rows("test")
    assert len(train) + len(test) == len(QUESTIONS) and len(test) == len(QUESTIONS) // 4
    assert {r["id"] for r in train}.isdisjoint({r["id"] for r in test})
    assert {r["db_id"] for r in train} == {"company", "library", "shop", "flights"}
    assert {r["difficulty"] for r in test} == {"easy", "medium", "hard"}


def test_unknown_builtin_split_is_named():
    with pytest.raises(DataError, match="no split 'validation'; splits: train, test"):
        SQLEnv.load_dataset("validation")


def test_builtin_sqlite_databases_are_generated_identically(tmp_path):
    first = ensure_builtin_databases("sqlite", tmp_path / "a")
    second = ensure_builtin_databases("sqlite", tmp_path / "b")
    assert folder_digest(first) == folder_digest(second)
    assert sorted(p.name for p in first.rglob("*.sqlite")) == ["company.sqlite", "flights.sqlite", "library.sqlite",
                                                                "shop.sqlite"]
    assert not list(first.rglob("*.partial"))


@pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb")
def test_builtin_duckdb_databases_hold_the_same_rows_as_sqlite(tmp_path):
    import duckdb

    sqlite_root = ensure_builtin_databases("sqlite", tmp_path)
    duck_root = ensure_builtin_databases("duckdb", tmp_path)
    for table in ("employees", "assignments"):
        lite = sqlite3.connect(sqlite_root / "company" / "company.sqlite").execute(
            f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        duck = duckdb.connect(str(duck_root / "company" / "company.duckdb"), read_only=True).execute(
            f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        assert lite == duck and len(lite) > 50


# -- benchmark layouts ----------------------------------------------------------------------------


@pytest.fixture
def spider_root(tmp_path: Path) -> Path:
    """A Spider-layout folder: <root>/<db_id>/<db_id>.sqlite."""
    db = tmp_path / "database" / "concert" / "concert.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?)", [(1, "Ana", 31), (2, "Bo", 25), (3, "Cy", 40)])
    conn.commit()
    conn.close()
    return tmp_path


def _write(path: Path, rows: list) -> Path:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_spider_json_rows_load_and_score(spider_root):
    questions = _write(spider_root / "dev.json", [
        {"db_id": "concert", "question": "How many singers are there?", "query": "SELECT count(*) FROM singer"},
        {"db_id": "concert", "question": "Names of singers older than 30?", "query": "SELECT name FROM singer WHERE age > 30"},
    ])
    config = SQLEnvConfig(data_files={"test": str(questions)}, db_root=str(spider_root / "database"))
    rows = SQLEnv.load_dataset("test", config)
    assert [r["id"] for r in rows] == ["concert-1", "concert-2"]
    env = SQLEnv(rows[1], config)
    messages, _ = env.reset(seed=0)
    assert "CREATE TABLE singer" in messages[1]["content"]
    assert env.step(f"{THINK}<solution>SELECT name FROM singer WHERE age >= 31</solution>").reward == 1.0


def test_bird_and_synsql_field_names(spider_root):
    questions = _write(spider_root / "train.json", [
        {"db_id": "concert", "question": "Oldest age?", "SQL": "SELECT MAX(age) FROM singer", "evidence": "age in years"},
        {"db_id": "concert", "question": "Youngest?", "sql": "SELECT MIN(age) FROM singer", "external_knowledge": "k"},
    ])
    bird, synsql = load_questions(questions)
    assert bird["reward_spec"]["ground_truth"] == "SELECT MAX(age) FROM singer"
    assert bird["external_knowledge"] == "age in years"
    assert synsql["reward_spec"]["ground_truth"] == "SELECT MIN(age) FROM singer"
    env = SQLEnv(bird, {"db_root": str(spider_root / "database")})
    assert "External knowledge: age in years" in env.reset(seed=0)[0][1]["content"]


def test_jsonl_rows(spider_root):
    path = spider_root / "q.jsonl"
    path.write_text('{"db_id": "concert", "question": "n?", "query": "SELECT 1"}\n\n'
                    '{"db_id": "concert", "question": "m?", "query": "SELECT 2"}\n', encoding="utf-8")
    assert [r["reward_spec"]["ground_truth"] for r in load_questions(path)] == ["SELECT 1", "SELECT 2"]


@pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb")
def test_skyrl_sql_parquet_rows_with_prompt_and_data_folder(tmp_path, spider_root):
    import duckdb

    # SkyRL-SQL keeps Spider databases under <data root>/spider/database.
    data_root = tmp_path / "sql_data"
    (data_root / "spider").mkdir(parents=True)
    (spider_root / "database").rename(data_root / "spider" / "database")
    parquet = tmp_path / "train.parquet"
    duckdb.execute(f"""COPY (SELECT 'spider' AS data, 'concert' AS db_id,
        [{{'role': 'system', 'content': 'sys'}}, {{'role': 'user', 'content': 'How many singers?'}}] AS prompt,
        'text2sql' AS env_class, {{'method': 'rule', 'ground_truth': 'SELECT count(*) FROM singer'}} AS reward_spec)
        TO '{parquet}' (FORMAT parquet)""")
    (row,) = load_questions(parquet)
    env = SQLEnv(row, {"db_root": str(data_root)})
    assert env.reset(seed=0)[0] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "How many singers?"}]
    assert env.database() == data_root / "spider" / "database" / "concert" / "concert.sqlite"
    assert env.step(f"{THINK}<solution>SELECT 3</solution>").reward == 1.0


@pytest.mark.parametrize(("rows", "message"), [
    ([{"db_id": "concert", "question": "q", "query": "SELECT 1"}, {"db_id": "concert", "question": "q"}],
     "q.json row 2: no gold SQL"),
    ([{"question": "q", "query": "SELECT 1"}], "q.json row 1: no 'db_id'"),
    ([{"db_id": "concert", "query": "SELECT 1"}], "q.json row 1: no 'question' text and no 'prompt' messages"),
    ([{"db_id": "concert", "query": "SELECT 1", "prompt": "just text", "question": "q"}],
     "q.json row 1: 'prompt' must be a list"),
    (["not an object"], "q.json row 1: expected an object, got str"),
    ({"oops": 1}, "q.json must hold a list of question objects"),
])
def test_malformed_rows_are_named_by_row_number(tmp_path, rows, message):
    with pytest.raises(DataError, match=message):
        load_questions(_write(tmp_path / "q.json", rows))


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_questions(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[{", encoding="utf-8")
    with pytest.raises(DatasetError, match="bad.json is not valid JSON"):
        load_questions(tmp_path / "bad.json")


def test_missing_split_and_missing_db_root_are_explained(spider_root):
    config = SQLEnvConfig(data_files={"train": "x.json"})
    with pytest.raises(DataError, match="env.data_files has no split 'test'; it has: train"):
        SQLEnv.load_dataset("test", config)
    with pytest.raises(DataError, match="set env.db_root"):
        resolve_database({"db_id": "concert"}, "sqlite", None, None)


def test_db_ids_cannot_escape_the_database_folder(spider_root):
    with pytest.raises(DataError, match="must be a plain database name"):
        resolve_database({"db_id": "../concert"}, "sqlite", str(spider_root / "database"), None)


def test_text_that_is_not_utf8_is_shown_not_fatal(spider_root):
    db = spider_root / "database" / "concert" / "concert.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO singer VALUES (4, CAST(x'4bff6c' AS TEXT), 50)")  # 'K\xffl'
    conn.commit()
    conn.close()
    row = {"id": "t", "db_id": "concert", "question": "Names?", "reward_spec": {"ground_truth": "SELECT name FROM singer"}}
    env = SQLEnv(row, {"db_root": str(spider_root / "database")})
    env.reset(seed=0)
    text = env.step(f"{THINK}<sql>SELECT name FROM singer WHERE id = 4</sql>").observation[0]["content"]
    assert "K\ufffdl" in text
