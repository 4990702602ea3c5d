"""What a model's query may do: read. Everything else is refused with a reason the model can read.

SQLite: an authorizer callback sees every operation the compiled statement would perform.
DuckDB: the parser reports each statement's type before anything runs.
"""

from __future__ import annotations

import sqlite3

READ_ONLY_HINT = "The database is read-only: only SELECT queries are allowed."

# PRAGMAs that only describe the schema; every other PRAGMA (and any PRAGMA assignment) is refused.
SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
                            "foreign_key_list", "table_list"})

_SQLITE_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_ACTION_CODES = ("CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
                 "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
                 "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
                 "DROP_VIEW", "INSERT", "PRAGMA", "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH",
                 "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT",
                 "RECURSIVE")
_SQLITE_NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name for name in _ACTION_CODES}
_ROW_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_FORBIDDEN_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})


class SQLiteGuard:
    """``sqlite3`` authorizer allowing reads only; remembers why it first refused something."""

    def __init__(self) -> None:
        self.refusal: str | None = None

    def __call__(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action in _SQLITE_ALLOWED:
            if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _FORBIDDEN_FUNCTIONS:
                return self._deny(f"the function {arg2}() is not allowed.")
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in SCHEMA_PRAGMAS:
            return sqlite3.SQLITE_OK
        what = _SQLITE_NAMES.get(action, f"operation {action}").replace("_", " ")
        if action in _ROW_WRITES and (arg1 or "").lower().startswith("sqlite_"):
            what = "Changing the schema (CREATE, DROP, ALTER)"  # SQLite reports DDL as a schema-table write
        elif action == sqlite3.SQLITE_PRAGMA:
            what = f"PRAGMA {arg1}" + (f" = {arg2}" if arg2 is not None else "")
        elif action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            what = f"{what} (other database files are not reachable)"
        return self._deny(f"{what} is not allowed.")

    def _deny(self, reason: str) -> int:
        if self.refusal is None:
            self.refusal = reason
        return sqlite3.SQLITE_DENY


DUCKDB_ALLOWED_TYPES = frozenset({"SELECT"})


def duckdb_refusal(statement_type: str, sql: str) -> str | None:
    """Why one DuckDB statement may not run, or ``None`` if it only reads."""
    if statement_type in DUCKDB_ALLOWED_TYPES:
        return None
    if statement_type == "PRAGMA":
        words = sql.strip().split(None, 1)
        name = words[1].split("(")[0].strip().lower() if len(words) == 2 else ""
        if name in SCHEMA_PRAGMAS or name == "show_tables":
            return None
        return f"PRAGMA {name} is not allowed."
    return f"{statement_type} statements are not allowed."
