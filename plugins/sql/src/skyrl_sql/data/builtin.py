"""Generate the built-in databases on first use and list the built-in questions.

Files land in ``<cache>/builtin-v1/<db_id>/<db_id>.sqlite`` (and ``.duckdb``), the Spider layout.
Generation is deterministic, so every machine gets identical data; files are written under a
temporary name and renamed, so concurrent first uses never see a half-written database.
"""

from __future__ import annotations

import os
import random
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from skyrl_core.data import DataError

from skyrl_sql.data.questions import QUESTIONS
from skyrl_sql.data.schemas import SCHEMAS, Schema

VERSION = "builtin-v1"
EXTENSIONS = {"sqlite": ".sqlite", "duckdb": ".duckdb"}
SPLITS = ("train", "test")
_INSERT_BATCH = 500


def default_cache_dir() -> Path:
    return Path(os.environ.get("SKYRL_SQL_CACHE") or Path.home() / ".cache" / "skyrl_sql")


def ensure_builtin_databases(engine: str, cache_dir: str | Path | None = None) -> Path:
    """The folder holding every built-in database for ``engine``, generating missing files."""
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root = root / VERSION
    for schema in SCHEMAS:
        path = root / schema.db_id / f"{schema.db_id}{EXTENSIONS[engine]}"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
            try:
                write_database(schema, engine, partial)
                os.replace(partial, path)
            finally:
                partial.unlink(missing_ok=True)
    return root


def write_database(schema: Schema, engine: str, path: Path) -> None:
    rows = schema.rows(random.Random(f"skyrl_sql-{schema.db_id}"))
    if engine == "sqlite":
        conn: Any = sqlite3.connect(path)
    else:
        import duckdb

        conn = duckdb.connect(str(path))
    try:
        for statement in schema.ddl:
            conn.execute(statement)
        for table, values in rows.items():
            _insert(conn, table, values)
        conn.commit()
    finally:
        conn.close()


def _insert(conn: Any, table: str, values: list[tuple]) -> None:
    if not values:
        return
    one = "(" + ", ".join("?" for _ in values[0]) + ")"
    for start in range(0, len(values), _INSERT_BATCH):
        batch = values[start:start + _INSERT_BATCH]
        conn.execute(f"INSERT INTO {table} VALUES " + ", ".join(one for _ in batch),
                     [v for row in batch for v in row])


def builtin_rows(split: str) -> list[dict[str, Any]]:
    """Task rows of a built-in split: two questions per database (a fixed quarter) form ``test``."""
    if split not in SPLITS:
        raise DataError(f"the built-in sql dataset has no split {split!r}; splits: {', '.join(SPLITS)}")
    rows = []
    for index, q in enumerate(QUESTIONS):
        if (split == "test") == (index % 4 == (index // 8) % 4):
            rows.append({"id": f"builtin-{index}", "data": "builtin", "db_id": q.db_id, "question": q.question,
                         "external_knowledge": q.external_knowledge, "difficulty": q.difficulty,
                         "reward_spec": {"method": "rule", "ground_truth": q.sql}})
    return rows
