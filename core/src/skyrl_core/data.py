"""Task rows for rollouts: an env's built-in dataset or a JSONL file of rows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skyrl_core.env import EnvConfig, TextEnv


class DataError(ValueError):
    """A dataset file or row is malformed; the message names the file and row number."""


def read_jsonl_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file, each a JSON object; blank lines are skipped.

    Errors name the row as every other message about a dataset row does, ``row N`` counted from 1
    over the rows (so ``skyrl check`` and the oracle's tables give the same row the same number), plus
    ``line L`` of the file where blank lines make the two differ.
    """
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"task file {str(path)!r} does not exist") from None
    for line_number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = row_where(len(rows) + 1, line_number)
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: {where} is not valid JSON: {exc.msg}") from None
        if not isinstance(row, Mapping):
            raise DataError(f"{path}: {where} must be a JSON object, got {type(row).__name__}")
        rows.append(dict(row))
    return rows


def row_where(number: int, line: int | None = None) -> str:
    """``row N`` (1-based), with ``(line L)`` when the file line differs from the row number."""
    return f"row {number}" + (f" (line {line})" if line is not None and line != number else "")


def load_tasks(env_cls: type[TextEnv], config: EnvConfig, *, split: str = "train", path: str | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
    """Rows from ``path`` when given, else the env's built-in ``split``; at most ``limit`` of them."""
    rows = read_jsonl_tasks(path) if path else list(env_cls.load_dataset(split, config))
    return rows[:limit] if limit else rows
