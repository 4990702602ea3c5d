"""Read Spider / BIRD / SynSQL / SkyRL-SQL question files into task rows, and find their databases.

Question files are JSON (a list of objects), JSONL or Parquet. A row needs ``db_id``, a question
(``question``, or a ready ``prompt`` as in SkyRL-SQL's Parquet files) and gold SQL under any of the
names the benchmarks use. Databases follow the Spider layout ``<root>/<db_id>/<db_id>.sqlite``;
for SkyRL-SQL rows the ``data`` field selects the benchmark's sub-folder of ``db_root``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skyrl_core.data import DataError

from skyrl_sql.data.builtin import EXTENSIONS, ensure_builtin_databases

GOLD_FIELDS = ("reward_spec.ground_truth", "query", "SQL", "sql", "gold_sql")
KNOWLEDGE_FIELDS = ("external_knowledge", "evidence")
# Where SkyRL-SQL's ``data`` values keep their databases below the data root.
BENCHMARK_FOLDERS = {"synsql": "SynSQL-2.5M/databases", "spider": "spider/database",
                     "bird": "bird/train/train_databases"}


class DatasetError(DataError):
    """A question file or one of its rows is unusable; the message names the file and row."""


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Task rows from a question file, each normalised by :func:`normalize_row`."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"question file {str(path)!r} does not exist")
    raw = _read_records(path)
    return [normalize_row(record, f"{path.name} row {number}") for number, record in enumerate(raw, start=1)]


def _read_records(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return _read_parquet(path)
        text = path.read_text(encoding="utf-8")
        if suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path.name} is not valid JSON: {exc}") from None
    if isinstance(data, Mapping):
        data = data.get("data", data.get("questions"))
    if not isinstance(data, list):
        raise DatasetError(f"{path.name} must hold a list of question objects")
    return data


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import duckdb
        except ImportError:
            raise DatasetError("reading Parquet needs pyarrow or duckdb: pip install 'skyrl-sql[duckdb]'") from None
        cursor = duckdb.connect().execute("SELECT * FROM read_parquet(?)", [str(path)])
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    return pq.read_table(path).to_pylist()


def normalize_row(record: Any, where: str) -> dict[str, Any]:
    """One question object as a task row: ``id, db_id, question, reward_spec.ground_truth`` and more."""
    if not isinstance(record, Mapping):
        raise DatasetError(f"{where}: expected an object, got {type(record).__name__}")
    row = dict(record)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    db_id = row.get("db_id") or extra.get("db_id")
    if not isinstance(db_id, str) or not db_id:
        raise DatasetError(f"{where}: no 'db_id'")
    gold = next((v for v in (_lookup(row, f) for f in GOLD_FIELDS) if isinstance(v, str) and v.strip()), None)
    if gold is None:
        raise DatasetError(f"{where}: no gold SQL (looked for {', '.join(repr(f) for f in GOLD_FIELDS)})")
    question = row.get("question")
    prompt = row.get("prompt")
    if not (isinstance(question, str) and question.strip()) and not _is_messages(prompt):
        raise DatasetError(f"{where}: no 'question' text and no 'prompt' messages")
    knowledge = next((row[f] for f in KNOWLEDGE_FIELDS if isinstance(row.get(f), str)), "")
    row.update(db_id=db_id, question=question or "", external_knowledge=knowledge,
               reward_spec={"method": "rule", "ground_truth": gold})
    row.setdefault("id", f"{db_id}-{where.rsplit(' ', 1)[-1]}")
    if prompt is not None and not _is_messages(prompt):
        raise DatasetError(f"{where}: 'prompt' must be a list of {{role, content}} messages")
    return row


def _lookup(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _is_messages(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in value))


def resolve_database(task: Mapping[str, Any], engine: str, db_root: str | None,
                     cache_dir: str | None) -> Path:
    """The database file of a task row, or a ``FileNotFoundError`` listing the paths tried."""
    if task.get("db_path"):
        return Path(task["db_path"])
    db_id = task.get("db_id")
    if not isinstance(db_id, str) or not db_id or "/" in db_id or db_id.startswith("."):
        raise DatasetError(f"task {task.get('id', '?')}: 'db_id' must be a plain database name, got {db_id!r}")
    data = task.get("data")
    if data == "builtin":
        roots = [ensure_builtin_databases(engine, cache_dir)]
    elif db_root is None:
        raise DatasetError("the task rows come from a question file: set env.db_root to the folder of databases")
    else:
        roots = [Path(db_root)]
        if isinstance(data, str) and data in BENCHMARK_FOLDERS:
            roots.insert(0, Path(db_root) / BENCHMARK_FOLDERS[data])
    name = f"{db_id}{EXTENSIONS[engine]}"
    tried = [p for root in roots for p in (root / db_id / name, root / name)]
    for path in tried:
        if path.is_file():
            return path
    raise FileNotFoundError(f"database {db_id!r} not found for engine {engine}; tried: "
                            + ", ".join(str(p) for p in tried))
