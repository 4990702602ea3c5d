"""The opening messages of a ``search`` episode, in Search-R1's format (our own wording)."""

from __future__ import annotations

SYSTEM_PROMPT = "You are a careful research assistant who looks facts up before answering."

INSTRUCTIONS = (
    "Answer the question below. You do not know the facts it asks about, so look them up.\n"
    "Think step by step inside <think> and </think> whenever you need to.\n"
    "To look something up, write a short query as <search> your query </search> and stop; the "
    "matching passages will come back between <information> and </information>. You may search "
    "several times, one query per reply, but you have at most {max_turns} replies in total.\n"
    "When you know the answer, give only the answer, a few words with no explanation, as "
    "<answer> Paris </answer>."
)


def user_prompt(question: str, max_turns: int) -> str:
    return f"{INSTRUCTIONS.format(max_turns=max_turns)}\n\nQuestion: {question.strip()}"


def prompt_messages(question: str, max_turns: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(question, max_turns)}]
