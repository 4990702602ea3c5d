"""TOML text from the plain data ``tomllib`` reads (tables, arrays, strings, numbers, booleans), for files we write.

Tables come after a table's own keys; a list of tables becomes ``[[name]]`` blocks; any other list is written
inline (its tables as inline tables). Dates are refused: no task file needs them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dumps(data: dict[str, Any]) -> str:
    """``data`` as TOML text that ``tomllib.loads`` reads back equal."""
    lines: list[str] = []
    _table(lines, (), data)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(lines: list[str], path: tuple[str, ...], table: dict[str, Any]) -> None:
    nested = [(key, value) for key, value in table.items() if isinstance(value, dict) or _is_table_array(value)]
    for key, value in table.items():
        if not (isinstance(value, dict) or _is_table_array(value)):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested:
        header = ".".join(_key(part) for part in (*path, key))
        if isinstance(value, dict):
            lines += ["", f"[{header}]"]
            _table(lines, (*path, key), value)
        else:
            for item in value:
                lines += ["", f"[[{header}]]"]
                _table(lines, (*path, key), item)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # JSON escapes are TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(key)} = {_value(item)}" for key, item in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} {value!r} as TOML")
