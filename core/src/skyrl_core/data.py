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
    """Rows of a JSONL file, each a JSON object (row numbers are 1-based in errors)."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"task file {str(path)!r} does not exist") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: row {number} is not valid JSON: {exc.msg}") from None
        if not isinstance(row, Mapping):
            raise DataError(f"{path}: row {number} must be a JSON object, got {type(row).__name__}")
        rows.append(dict(row))
    return rows


def load_tasks(env_cls: type[TextEnv], config: EnvConfig, *, split: str = "train", path: str | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
    """Rows from ``path`` when given, else the env's built-in ``split``; at most ``limit`` of them."""
    rows = read_jsonl_tasks(path) if path else list(env_cls.load_dataset(split, config))
    return rows[:limit] if limit else rows
