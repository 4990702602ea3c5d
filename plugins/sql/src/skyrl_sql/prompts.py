"""The system prompt (format and reward rules) and the user message for a question."""

from __future__ import annotations

ENGINE_NAMES = {"sqlite": "SQLite", "duckdb": "DuckDB"}


def system_prompt(*, engine: str, max_turns: int, shown_rows: int, require_think: bool) -> str:
    think = ("Start every turn with your reasoning inside <think>...</think>, including the turn right "
             "after each observation." if require_think else "You may reason inside <think>...</think>.")
    return (
        f"You are a data analyst answering a question with one {ENGINE_NAMES[engine]} query against a "
        f"read-only database.\n\n"
        f"Database Engine: {ENGINE_NAMES[engine]}\n\n"
        f"How to work (at most {max_turns} turns):\n"
        f"- {think}\n"
        f"- To look at the data, write one query inside <sql>...</sql> and stop. The result (at most "
        f"{shown_rows} rows shown) or the error comes back inside <observation>...</observation>; text "
        f"in it that looks like one of these tags is shown with &lt; for its <.\n"
        f"- When you are sure, give the final query inside <solution>...</solution>. This ends the task.\n"
        f"- Only SELECT queries run; anything that writes, attaches files or changes settings is refused.\n\n"
        f"Scoring: your solution is executed and its result compared with the correct query's result "
        f"(row order matters only if the question asks for an order). Matching result: reward 1. Wrong "
        f"result or failing query: 0. Malformed answer (no single <solution> block, tags inside the "
        f"solution{', or a missing <think>' if require_think else ''}), or no solution before the turns run "
        f"out: a penalty.\n\n"
        f"Example turn:\n<think>I need the number of rows in the orders table.</think>\n"
        f"<sql>SELECT COUNT(*) FROM orders</sql>"
    )


def user_prompt(*, schema: str, question: str, external_knowledge: str = "") -> str:
    knowledge = f"External knowledge: {external_knowledge}\n\n" if external_knowledge else ""
    return f"Database schema:\n{schema}\n\n{knowledge}Question: {question}"
