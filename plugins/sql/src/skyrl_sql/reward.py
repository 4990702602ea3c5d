"""Execution-match reward: does the submitted query return what the gold query returns?

Rows are compared as tuples (column order matters, column names do not). When the gold query
orders its top-level result, row order matters; otherwise rows are compared as sets (SkyRL-SQL:
duplicates ignored) or as multisets (``duplicates="count"``). Numbers compare by value across types
(``3 == 3.0``, ``True == 1``) after rounding to 9 significant digits, so ``0.1 + 0.2`` equals ``0.3``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

_SIGNIFICANT_DIGITS = 9
_STRING_OR_COMMENT = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", re.DOTALL)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def normalize_value(value: Any) -> Any:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, (int, float)):
        number = float(value)
        if number != number or number in (float("inf"), float("-inf")):
            return ("number", repr(number))
        return ("number", float(f"{number:.{_SIGNIFICANT_DIGITS}g}"))
    return ("text", value)


def normalize_row(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(normalize_value(v) for v in row)


def results_match(predicted: Sequence[Sequence[Any]], gold: Sequence[Sequence[Any]], *, ordered: bool,
                  duplicates: Literal["ignore", "count"] = "ignore") -> bool:
    pred_rows = [normalize_row(r) for r in predicted]
    gold_rows = [normalize_row(r) for r in gold]
    if ordered:
        return pred_rows == gold_rows
    if duplicates == "ignore":
        return set(pred_rows) == set(gold_rows)
    return Counter(pred_rows) == Counter(gold_rows)


def strip_literals(sql: str) -> str:
    """``sql`` with string literals, quoted identifiers and comments blanked out."""
    return _STRING_OR_COMMENT.sub(" ", sql)


def orders_result(sql: str) -> bool:
    """Whether the outermost query has an ORDER BY (one inside parentheses orders a subquery only)."""
    text = strip_literals(sql)
    depth = 0
    top_level = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        top_level.append(char if depth == 0 else " ")
    return bool(_ORDER_BY.search("".join(top_level)))


def normalize_sql(sql: str) -> str:
    """Lower-cased, whitespace-collapsed, without a trailing semicolon: for the exact-match metric."""
    return " ".join(sql.strip().rstrip(";").split()).lower()
