"""Tagged text that data must not forge: what envs with XML-like action tags share (``<sql>``/``<solution>``,
``<search>``/``<answer>``, ...).

Two rules keep a reward with the model's own actions:

- :func:`neutralize_tags` writes the ``<`` of anything like one of an episode's tags as ``&lt;`` in text
  the env shows (a query result, a retrieved passage, an error), so data never looks like the end of an
  observation or a turn of the model's own.
- :func:`outside_blocks` blanks the complete ``<tool>...</tool>`` blocks of one action, so that what a
  tool call quotes (a passage it saw, a literal holding ``</solution>``) is never read as the action's
  answer or format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache


def neutralize_tags(text: str, names: Sequence[str]) -> str:
    """``text`` with the ``<`` of every tag named in ``names`` (any case, spaces or ``/`` inside) written
    ``&lt;``; idempotent."""
    return _tag_start(tuple(names)).sub("&lt;", text)


def outside_blocks(action: str, tool: str, answer: str) -> str:
    """``action`` with every complete ``<tool>...</tool>`` block blanked to spaces (positions kept).

    Blocks are read left to right, each ending at its own closing tag, so a ``<tool>`` opened inside an
    ``<answer>...</answer>`` block is the answer's text and stays.
    """
    opening = f"<{tool}>"
    return _blocks(tool, answer).sub(lambda m: " " * len(m.group()) if m.group().startswith(opening) else m.group(),
                                     action)


@lru_cache(maxsize=64)
def _tag_start(names: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"<(?=\s*/?\s*(?:" + "|".join(map(re.escape, names)) + r")\b)", re.IGNORECASE)


@lru_cache(maxsize=64)
def _blocks(tool: str, answer: str) -> re.Pattern[str]:
    t, a = re.escape(tool), re.escape(answer)
    return re.compile(f"<{t}>.*?</{t}>|<{a}>.*?</{a}>", re.DOTALL)
