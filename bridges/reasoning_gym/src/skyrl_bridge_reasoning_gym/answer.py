"""Which part of a reply is the answer: the rule the env and its docs share.

A reply answers when it holds exactly one ``<answer>`` tag and exactly one ``</answer>`` tag, the opening one
first; the text between them, stripped of surrounding whitespace, is the answer the dataset scores (an empty
block is the empty answer: a few datasets' gold answer is the empty string). A reply with no answer tag, with
only one of the two tags, with the closing tag first, or with several answer blocks answers nothing, and is
scored as the dataset scores a missing answer (``score_answer(None, entry)``, 0 for most datasets). Tags are
matched exactly (lower case, no spaces), as reasoning-gym's own ``extract_answer`` does.
"""

from __future__ import annotations

OPEN, CLOSE = "<answer>", "</answer>"


def extract_answer(reply: str) -> str | None:
    """The answer ``reply`` gives, or ``None`` when it gives none (see the module's rule)."""
    if reply.count(OPEN) != 1 or reply.count(CLOSE) != 1:
        return None
    start, end = reply.index(OPEN), reply.index(CLOSE)
    if end < start:
        return None
    return reply[start + len(OPEN):end].strip()


def has_answer_tag(reply: str) -> bool:
    """The reply tried to answer (any answer tag): on an episode with turns left, such a reply still ends it."""
    return OPEN in reply or CLOSE in reply


def answer_block(answer: str) -> str:
    return f"{OPEN}{answer}{CLOSE}"
