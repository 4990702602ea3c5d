"""Observation text in SkyRL-SQL's shape: ``<observation>`` body ``<reminder>`` turns left.

The body never holds the episode's tags: where a result cell, a column name or an error message
holds text like ``</observation>`` or ``<solution>``, its ``<`` is shown as ``&lt;``, so what the
data says can never look like the end of the observation or a turn of the model's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl_core import tags

from skyrl_sql.worker.result import QueryResult

INVALID_ACTION = ("Your previous action is invalid. Follow the format of outputting thinking process and sql "
                  "tool, and try again.")
EPISODE_TAGS = ("observation", "reminder", "think", "sql", "solution")


def neutralize_tags(text: str) -> str:
    """``text`` with the ``<`` of anything like one of the episode's tags written ``&lt;`` (idempotent)."""
    return tags.neutralize_tags(text, EPISODE_TAGS)


def observation(body: str, turns_left: int) -> str:
    return (f"\n<observation>{neutralize_tags(body)}\n<reminder>You have {turns_left} turns left to complete "
            f"the task.</reminder></observation>\n")


def result_body(result: QueryResult, *, max_rows: int, max_bytes: int, shown_rows: int, max_chars: int) -> str:
    """What the model sees after a query: a table, an error, or which limit stopped the query."""
    if result.status == "error":
        return f"Error executing SQL: {result.message}"
    if result.status == "timeout":
        return f"SQL Timeout: {result.message}"
    if result.status == "crashed":
        return f"SQL Crashed: {result.message}"
    if result.status == "refused":
        return result.message
    rows = result.rows[:shown_rows]
    table = format_table(result.columns, rows)
    while len(table) > max_chars and rows:
        rows = rows[: len(rows) // 2]
        table = format_table(result.columns, rows)
    notes = []
    if result.cut == "rows":
        notes.append(f"Row limit hit: the query returned more than {max_rows:,} rows and was cut off.")
    elif result.cut == "bytes":
        notes.append(f"Size limit hit: the result exceeded {max_bytes:,} bytes and was cut off "
                     f"after {len(result.rows):,} rows.")
    if len(rows) < len(result.rows):
        total = f"{len(result.rows):,}{'+' if result.cut else ''}"
        notes.append(f"Showing the first {len(rows)} of {total} rows.")
    if not result.rows and not result.cut:
        notes.append("The query returned no rows.")
    return "\n".join([table, *notes]) if table else "\n".join(notes)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Right-aligned plain-text table with a header line (like ``DataFrame.to_string(index=False)``)."""
    if not columns:
        return ""
    cells = [[neutralize_tags(str(c)) for c in columns]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(" ".join(value.rjust(width) for value, width in zip(line, widths, strict=True)) for line in cells)


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", "\\n")
    return neutralize_tags(text if len(text) <= 200 else text[:197] + "...")
