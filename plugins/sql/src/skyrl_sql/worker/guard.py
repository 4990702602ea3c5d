"""What a model's query may do: read. Everything else is refused with a reason the model can read.

SQLite: an authorizer callback sees every operation the compiled statement would perform.
DuckDB: the parser reports each statement's type, and the parse tree of a query names every
function and table it uses, before anything runs.

A refusal names the statement the model wrote (``VACUUM``, ``ANALYZE``, ``INSTALL``) by its leading
keyword, because both engines file some statements under another kind: SQLite's authorizer sees
VACUUM as an ATTACH and ANALYZE as a write to the schema table; DuckDB parses ANALYZE as VACUUM,
INSTALL as LOAD and CHECKPOINT as CALL.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

READ_ONLY_HINT = "The database is read-only: only SELECT queries are allowed."

# PRAGMAs that only describe the schema; every other PRAGMA (and any PRAGMA assignment) is refused.
SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
                            "foreign_key_list", "table_list"})

_PREAMBLE = re.compile(r"(?:\s+|--[^\n]*|/\*.*?(?:\*/|$)|\()*", re.DOTALL)  # blanks, comments, "("
_KEYWORD = re.compile(r"(?:FORCE\s+)?[A-Za-z_]+", re.IGNORECASE)
_PRAGMA_NAME = re.compile(r"PRAGMA\s+(\w+)", re.IGNORECASE)
# Keywords that open a read or wrap another statement; the engine's own name is used for those.
_WRAPPERS = frozenset({"WITH", "SELECT", "VALUES", "FROM", "TABLE", "EXPLAIN"})


def _body(sql: str) -> str:
    """``sql`` from its first keyword on (leading blanks, comments and parentheses skipped)."""
    return _PREAMBLE.sub("", sql, count=1)


def _leading_keyword(sql: str) -> str:
    """The statement's first keyword, upper-cased ("" when it starts with something else)."""
    match = _KEYWORD.match(_body(sql))
    return " ".join(match.group().upper().split()) if match else ""


def statement_refusal(sql: str, engine_name: str) -> str:
    """The refusal of a whole statement, named by its leading keyword (else by ``engine_name``)."""
    keyword = _leading_keyword(sql)
    name = engine_name.replace("_", " ") if not keyword or keyword in _WRAPPERS else keyword
    return f"{name} statements are not allowed."


# -- SQLite ---------------------------------------------------------------------------------------

_SQLITE_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_ACTION_CODES = ("CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
                 "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
                 "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
                 "DROP_VIEW", "INSERT", "PRAGMA", "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH",
                 "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT",
                 "RECURSIVE")
_SQLITE_NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name for name in _ACTION_CODES}
_FORBIDDEN_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# Maintenance statements, refused by name before they are prepared: the authorizer lets REINDEX run
# on a read-only connection (rebuilding every index of the database, as long as that takes).
SQLITE_MAINTENANCE = frozenset({"REINDEX", "VACUUM", "ANALYZE"})


def sqlite_statement_refusal(sql: str) -> str | None:
    """The refusal of an SQLite maintenance statement (named as written), or None for any other statement."""
    keyword = _leading_keyword(sql)
    return f"{keyword} statements are not allowed." if keyword in SQLITE_MAINTENANCE else None


class SQLiteGuard:
    """``sqlite3`` authorizer allowing reads only; remembers why it first refused something.

    Call :meth:`arm` with each query before running it, so refusals can name its statement.
    """

    def __init__(self) -> None:
        self.sql = ""
        self.refusal: str | None = None

    def arm(self, sql: str) -> None:
        self.sql = sql
        self.refusal = None

    def __call__(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action in _SQLITE_ALLOWED:
            if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _FORBIDDEN_FUNCTIONS:
                return self._deny(f"the function {arg2}() is not allowed.")
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in SCHEMA_PRAGMAS:
                return sqlite3.SQLITE_OK
            return self._deny(f"PRAGMA {arg1}" + (f" = {arg2}" if arg2 is not None else "") + " is not allowed.")
        return self._deny(statement_refusal(self.sql, _SQLITE_NAMES.get(action, f"operation {action}")))

    def _deny(self, reason: str) -> int:
        if self.refusal is None:
            self.refusal = reason
        return sqlite3.SQLITE_DENY


def declare_pragma_functions(conn: sqlite3.Connection) -> None:
    """Load every PRAGMA table function (``pragma_table_info(...)`` and kin) into ``conn``.

    On first use SQLite declares such a function's table, which the authorizer sees as writes to
    the schema table; declared here, before the authorizer is set, a query that uses one shows only
    its reads and its PRAGMA (allowed for schema PRAGMAs, refused by name otherwise). ``WHERE 0``
    declares without running the PRAGMA.
    """
    for (name,) in conn.execute("SELECT name FROM pragma_pragma_list").fetchall():
        try:
            conn.execute(f'SELECT * FROM "pragma_{name}" WHERE 0')
        except sqlite3.OperationalError:
            pass  # a PRAGMA without a table function


# -- DuckDB ---------------------------------------------------------------------------------------

DUCKDB_ALLOWED_TYPES = frozenset({"SELECT"})
# Catalog functions and views whose output holds the database file's absolute path (directly, or in
# the allowed_paths setting), and functions that run SQL given as a string, hiding what they call.
_PATH_REVEALING = "it shows the server's file paths"
_RUNS_SQL_TEXT = "it runs SQL given as text"
DUCKDB_HIDDEN_FUNCTIONS = {"duckdb_databases": _PATH_REVEALING, "duckdb_settings": _PATH_REVEALING,
                           "current_setting": _PATH_REVEALING, "query": _RUNS_SQL_TEXT,
                           "query_table": _RUNS_SQL_TEXT, "json_execute_serialized_sql": _RUNS_SQL_TEXT}
DUCKDB_HIDDEN_VIEWS = {"duckdb_databases": _PATH_REVEALING, "pragma_database_list": _PATH_REVEALING,
                       "pg_settings": _PATH_REVEALING}
_HIDDEN_NAMES = DUCKDB_HIDDEN_FUNCTIONS.keys() | DUCKDB_HIDDEN_VIEWS.keys()


def duckdb_refusal(conn: Any, statement_type: str, sql: str) -> str | None:
    """Why one DuckDB statement may not run, or ``None`` if it only reads (and hides no path)."""
    if statement_type in DUCKDB_ALLOWED_TYPES:
        return _duckdb_select_refusal(conn, sql)
    pragma = _PRAGMA_NAME.match(_body(sql))
    if statement_type == "PRAGMA" and pragma:
        name = pragma.group(1).lower()
        return None if name in SCHEMA_PRAGMAS or name == "show_tables" else f"PRAGMA {name} is not allowed."
    return statement_refusal(sql, statement_type)


def _duckdb_select_refusal(conn: Any, sql: str) -> str | None:
    lowered = sql.lower()
    if not any(name in lowered for name in _HIDDEN_NAMES):
        return None  # DuckDB matches names up to ASCII case only, so a use spells one out; skip parsing
    tree = json.loads(conn.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        return f"this query could not be checked ({tree.get('error_message', 'no reason given')})."
    for key, name in _names(tree):
        hidden = (DUCKDB_HIDDEN_FUNCTIONS if key == "function_name" else DUCKDB_HIDDEN_VIEWS).get(name)
        if hidden:
            return f"{name} is not allowed: {hidden}."
    return None


def _names(tree: Any) -> Iterator[tuple[str, str]]:
    """Every ``(key, lower-cased name)`` for the functions and tables a serialized parse tree uses."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("function_name", "table_name"):
                if isinstance(node.get(key), str):
                    yield key, node[key].strip('"').lower()
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
