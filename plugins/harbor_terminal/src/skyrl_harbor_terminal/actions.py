"""The action format: shell commands in fenced code blocks, and ``<done/>`` when the task is finished.

Every fenced block tagged ``bash``, ``sh``, ``shell`` or untagged is a command block; blocks run in
order, each as one unit in the persistent shell. A block still open at the end of the reply (the
model stopped mid-block) runs as well. ``<done/>`` (or ``<done>``) outside the blocks ends the
agent's work on the task after this reply's commands; text outside blocks is otherwise ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_SHELL_TAGS = {"", "bash", "sh", "shell", "console", "zsh"}
_DONE = re.compile(r"<\s*done\s*/?\s*>", re.I)


@dataclass(frozen=True)
class ParsedAction:
    commands: list[str]  # command blocks in order (empty blocks dropped)
    done: bool
    other_blocks: int  # fenced blocks in another language (not run)


def parse_action(text: str) -> ParsedAction:
    commands: list[str] = []
    other = 0
    outside: list[str] = []
    position = 0
    for match in _FENCE.finditer(text):
        outside.append(text[position:match.start()])
        position = match.end()
        if match.group(2).lower() in _SHELL_TAGS:
            body = match.group(3).strip("\n")
            if body.strip():
                commands.append(body)
        else:
            other += 1
    outside.append(text[position:])
    return ParsedAction(commands, bool(_DONE.search("".join(outside))), other)
