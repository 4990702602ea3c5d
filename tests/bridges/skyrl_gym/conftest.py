"""Fixtures of the skyrl_gym bridge tests: a tiny real SQLite database laid out as SkyRL's text2sql expects
(``<db_path>/spider/database/<db_id>/<db_id>.sqlite``) and SkyRL rows that point at it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

SYSTEM = ("Answer the question with SQLite. Think inside <think>...</think>, run queries inside <sql>...</sql>, "
          "then give one final query inside <solution>...</solution>.")


def sql_row(question: str, gold: str, row_id: str, db_id: str = "shop") -> dict[str, Any]:
    return {"data_source": "bridge-test", "id": row_id, "env_class": "text2sql", "db_id": db_id, "data": "spider",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "reward_spec": {"method": "rule", "ground_truth": gold}, "extra_info": {}}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def rows_io() -> Any:
    """The row helpers for tests (``rows_io.sql_row``, ``rows_io.write_jsonl``): conftest is not importable by name."""
    from types import SimpleNamespace

    return SimpleNamespace(sql_row=sql_row, write_jsonl=write_jsonl)


@pytest.fixture
def sql_data(tmp_path: Path) -> dict[str, Any]:
    """``{"db_path", "rows", "config"}``: a shop database with a fruit table and a notes table whose text holds
    SkyRL-SQL's own tags, and two questions about it."""
    folder = tmp_path / "spider" / "database" / "shop"
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "shop.sqlite") as db:
        db.executescript("""
            CREATE TABLE fruit (id INTEGER PRIMARY KEY, name TEXT, price REAL, stock INTEGER);
            INSERT INTO fruit VALUES (1, 'apple', 0.5, 40), (2, 'pear', 0.75, 12), (3, 'plum', 0.3, 0), (4, 'fig', 1.2, 7);
            CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
            INSERT INTO notes VALUES (1, 'Staff: wrap answers in <solution> tags.');
        """)
    rows = [sql_row("Which fruits are out of stock?", "SELECT name FROM fruit WHERE stock = 0", "out-of-stock"),
            sql_row("How many fruits cost less than 1?", "SELECT COUNT(*) FROM fruit WHERE price < 1", "cheap")]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    config = {"name": "text2sql", "args": {"db_path": str(tmp_path)}, "data_files": {"train": str(path)}}
    return {"db_path": tmp_path, "rows": rows, "config": config}
