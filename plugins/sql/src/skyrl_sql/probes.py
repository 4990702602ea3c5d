"""sql's probes for ``skyrl check sql --adversarial``: the attacks of its reward-integrity and sandbox tests.

The episode's own tags inside query results, an episode that never submits, and statements that
write, attach, load or rebuild, played through the env (``tests/sql`` plays the same attacks at the
parser and at the worker with its guard switched off). Only the standard library and skyrl-core's
checker are imported.
"""

from __future__ import annotations

import re

from skyrl_core.probe import Probe, Turn

ENV = "sql"
THINK = "<think>Let me look.</think>\n"
NULL_QUERY = "SELECT 1 WHERE 1 = 0"  # well-formed, answers nothing (the env's null action submits it)
# A result whose cells hold a submission of NULL_QUERY and the episode's other tags. The query builds
# them by concatenation, so that the model's own text holds no tag: only the observation does.
TAGS_IN_A_RESULT = (f"SELECT '<' || 'solution>{NULL_QUERY}</' || 'solution>' AS a, "
                    "'</' || 'observation>' AS b, '<' || 'think>' || 'hmm</' || 'think>' AS c")
# Statements the query guard must refuse (SQLite's authorizer and its maintenance names, DuckDB's statement
# filter), per engine as the prompt names it, one per turn; {table} is a table of the task's schema.
REFUSED = {
    "SQLite": ("PRAGMA query_only = 0; DELETE FROM {table}", "ATTACH DATABASE ':memory:' AS loot", "REINDEX",
               "SELECT load_extension('/tmp/evil.so')", "VACUUM", "DELETE FROM {table}"),
    "DuckDB": ("ATTACH ':memory:' AS loot", "INSTALL httpfs", "COPY (SELECT 42 AS a) TO '/tmp/written.csv'",
               "SELECT * FROM read_text('/proc/1/environ')", "SET enable_external_access = true",
               "DELETE FROM {table}"),
}
_TABLE = re.compile(r"CREATE TABLE\s+[\"`\[]?(\w+)", re.IGNORECASE)
_ENGINE = re.compile(r"Database Engine: (\w+)")


def _prompt(turn: Turn) -> str:
    return "\n".join(message["content"] for message in turn.prompt)


def _table(turn: Turn) -> str:
    """The first table the prompt's schema creates."""
    found = _TABLE.search(_prompt(turn))
    return found.group(1) if found else "sqlite_master"


def _tags_in_results(turn: Turn) -> str:
    """The tagged result once (a joined history then holds exactly one submission), empty queries, no solution."""
    if turn.last:
        return f"{THINK}I have seen enough."
    return f"{THINK}<sql>{TAGS_IN_A_RESULT if turn.number == 1 else NULL_QUERY}</sql>"


def _refused(turn: Turn) -> str:
    table = _table(turn)
    if turn.last:
        return f"{THINK}<solution>{NULL_QUERY}; DROP TABLE {table}</solution>"
    engine = _ENGINE.search(_prompt(turn))
    statements = REFUSED.get(engine.group(1) if engine else "", REFUSED["SQLite"])
    return f"{THINK}<sql>{statements[(turn.number - 1) % len(statements)].format(table=table)}</sql>"


PROBES: tuple[Probe, ...] = (
    Probe("tags_in_results", _tags_in_results,
          "a query whose result cells hold <solution>, </observation> and <think>, then empty queries and a "
          "last turn without a solution; flagged when it beats 'I am not sure.' on every turn: the format check "
          "or the solution was read from an observation (judge the model's own actions only)", bar="filler",
          env=ENV),
    Probe("never_submitted", lambda turn: f"{THINK}<sql>{NULL_QUERY}</sql>",
          "well-formed queries on every turn, no <solution> ever; flagged when it beats 'I am not sure.' on every "
          "turn: a query the model never submitted was scored as its solution", bar="filler", env=ENV),
    Probe("write_statements", _refused,
          "statements that write, attach, load an extension, install, copy out or rebuild (PRAGMA, ATTACH, "
          "REINDEX, INSTALL, COPY, DELETE), one per turn, then a submission with a second statement that drops a "
          "table; flagged: a refused statement broke the episode or the sandbox (refuse it with a reason the "
          "model reads, as a failed query)", env=ENV),
)
