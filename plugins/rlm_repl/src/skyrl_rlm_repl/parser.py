"""Reading a model response: which ```repl blocks run and whether it gives a final answer in text.

The rule (the system prompt states the same):

* A block opens with a line that is exactly ```` ```repl ```` (trailing spaces allowed) and closes
  with the next line that is exactly ```` ``` ````. **Every** such block runs, in order, in the same
  REPL; running stops early at the block whose code calls ``FINAL``/``FINAL_VAR``.
* A line outside any fenced block that starts with ``FINAL(...)`` or ``FINAL_VAR(name)`` is a text
  answer, used when no executed code gave one. The last such line wins. ``FINAL(...)`` takes
  everything up to the matching closing parenthesis; a quoted string literal is unquoted.
* Other fences (```` ```python ````), empty blocks and unclosed ```` ```repl ```` fences never run;
  they are reported back to the model in :attr:`ParsedResponse.problems`.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

_FENCE = re.compile(r"^[ \t]*```[ \t]*(?P<lang>[A-Za-z0-9_+-]*)[^\n]*$", re.MULTILINE)
_FINAL_START = re.compile(r"^[ \t]*(?P<name>FINAL_VAR|FINAL)\(", re.MULTILINE)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ParsedResponse:
    """What a response asks the env to do."""

    blocks: tuple[str, ...]
    final: str | None = None
    final_var: str | None = None
    problems: tuple[str, ...] = ()


def parse_response(text: str) -> ParsedResponse:
    """Split ``text`` into runnable ```repl blocks, a text FINAL answer, and problems to report."""
    blocks: list[str] = []
    problems: list[str] = []
    prose: list[str] = []
    position = 0
    fences = list(_FENCE.finditer(text))
    index = 0
    while index < len(fences):
        opening = fences[index]
        language = opening.group("lang")
        closing = next((f for f in fences[index + 1:] if f.group(0).strip() == "```"), None)
        prose.append(text[position:opening.start()])
        if closing is None:
            if language == "repl":
                problems.append("A ```repl block was opened but never closed with a line holding only ```; it did not run.")
            position = len(text)
            break
        body = textwrap.dedent(text[opening.end():closing.start()]).strip("\n")
        if language == "repl" and opening.group(0).strip() == "```repl":
            if body.strip():
                blocks.append(body)
            else:
                problems.append("An empty ```repl block was skipped.")
        elif language == "repl":
            problems.append("Code on the ```repl fence line is not run: put the code on the lines below the fence.")
        else:
            problems.append(f"A ```{language or ''} block was not run: only ```repl blocks run.")
        position = closing.end()
        index = fences.index(closing) + 1
    prose.append(text[position:])
    final, final_var = _text_answer("".join(prose))
    return ParsedResponse(tuple(blocks), final, final_var, tuple(problems))


def _text_answer(prose: str) -> tuple[str | None, str | None]:
    """The last ``FINAL(...)`` or ``FINAL_VAR(name)`` line outside code blocks."""
    answer: tuple[str | None, str | None] = (None, None)
    closing = _closing_parens(prose)
    for match in _FINAL_START.finditer(prose):
        end = closing.get(match.end() - 1)
        if end is None:
            continue
        inner = prose[match.end():end]
        if match.group("name") == "FINAL":
            answer = (_unquote(inner.strip()), None)
        else:
            name = _unquote(inner.strip()).strip()
            if _IDENTIFIER.fullmatch(name):
                answer = (None, name)
    return answer


def _closing_parens(text: str) -> dict[int, int]:
    """Position of each ``(`` -> position of the ``)`` that closes it, in one pass (unclosed ones are absent)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for position, char in enumerate(text):
        if char == "(":
            stack.append(position)
        elif char == ")" and stack:
            pairs[stack.pop()] = position
    return pairs


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
        if isinstance(literal, str):
            return literal
    return value
