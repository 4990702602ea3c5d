"""Helpers shared by the skyrl-sql tests."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from skyrl_sandbox.registry import backend_names
from skyrl_sql.data.builtin import builtin_rows
from skyrl_sql.env import SQLEnv

HAS_DUCKDB = importlib.util.find_spec("duckdb") is not None
ENGINES = ["sqlite", pytest.param("duckdb", marks=pytest.mark.skipif(not HAS_DUCKDB, reason="needs duckdb"))]
# The sandbox backends the sql env runs on (every installed one); use with parametrize(..., indirect=True)
# (conftest's `backend`).
BACKENDS = list(backend_names())
# Backends whose worker processes are this process's descendants (tests that find them in the process tree).
PROCESS_BACKENDS = ["bwrap", "subprocess"]
THINK = "<think>Let me look.</think>\n"


def folder_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in a folder, so a test also notices journal or WAL files appearing."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def task(row_id: str = "builtin-0") -> dict[str, Any]:
    """A built-in row; ``builtin-0`` asks "How many employees are there?" (SELECT COUNT(*) FROM employees)."""
    return next(row for row in builtin_rows("train") + builtin_rows("test") if row["id"] == row_id)


def started_env(engine: str = "sqlite", row: dict[str, Any] | None = None, **options: Any) -> SQLEnv:
    env = SQLEnv(row or task(), {"engine": engine, **options})
    env.reset(seed=0)
    return env


def query(env: SQLEnv, sql: str) -> str:
    """Run one exploration turn and return the observation text."""
    result = env.step(f"{THINK}<sql>{sql}</sql>")
    assert not result.terminated and not result.info.get("error"), result.info
    return result.observation[0]["content"]


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first (with bwrap the Python worker comes last)."""
    children = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                for c in (t / "children").read_text().split()]
    return [pid] + [d for child in children for d in descendants(child)]
