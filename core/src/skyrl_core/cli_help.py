"""Readable ``--help`` for skyrl's CLI and plugins' own: plain click layout (typer's rich panels cut long
option names to fit their column), wrapped at the terminal's width, and commands listed with whole
sentences."""

from __future__ import annotations

import inspect
import re
import shutil
from typing import Any

from typer.core import TyperGroup

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.core import Command, Context
    from typer._click.formatting import HelpFormatter
except ImportError:  # pragma: no cover - an older typer on click itself
    from click.core import Command, Context
    from click.formatting import HelpFormatter

HELP_FALLBACK_COLUMNS = 100  # when no terminal says how wide it is (a pipe, a test)
NON_BREAKING_HYPHEN = "\u2011"
# The end of a sentence: ".", "!" or "?" before a space or the end, but not "e.g." or "i.e.".
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)[.!?](?=\s|$)")


def help_format() -> dict[str, Any]:
    """``typer.Typer`` settings for readable help (skyrl's and plugins' own CLIs): no rich panels, text
    wrapped at the terminal's width (``COLUMNS``, else the terminal's; 100 columns without one) and
    only at spaces, and commands listed with whole sentences (:class:`HelpGroup`)."""
    width = max(shutil.get_terminal_size((HELP_FALLBACK_COLUMNS, 24)).columns - 2, 50)
    return {"cls": HelpGroup, "rich_markup_mode": None,
            "context_settings": {"terminal_width": width, "max_content_width": width}}


class SpaceWrappingHelpFormatter(HelpFormatter):
    """click's help formatter, breaking lines at spaces only: never inside an option name
    (``--sampler-gpu-memory-utilization``) or a value (``tiny-random``), whose hyphens are
    non-breaking while the text is wrapped."""

    def write_text(self, text: str) -> None:
        super().write_text(text.replace("-", NON_BREAKING_HYPHEN))

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        glued = [(first.replace("-", NON_BREAKING_HYPHEN), second.replace("-", NON_BREAKING_HYPHEN))
                 for first, second in rows]
        super().write_dl(glued, col_max, col_spacing)

    def getvalue(self) -> str:
        return super().getvalue().replace(NON_BREAKING_HYPHEN, "-")


class HelpContext(Context):
    formatter_class = SpaceWrappingHelpFormatter


class HelpGroup(TyperGroup):
    """A command group whose help lists every command (its own and its sub-groups', plugins' included)
    with a whole sentence: its ``short_help``, else the first sentence of its help, where click would cut
    that sentence at the width with "..."."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _whole_short_helps(self)


def _whole_short_helps(command: Command) -> None:
    command.context_class = HelpContext
    if not command.short_help and command.help:
        command.short_help = first_sentence(command.help)
    for sub in getattr(command, "commands", {}).values():  # a group's
        _whole_short_helps(sub)


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph, on one line (``e.g.`` does not end one)."""
    paragraph = inspect.cleandoc(text).partition("\f")[0].split("\n\n")[0]
    flat = " ".join(paragraph.replace("\b", "").split())
    end = SENTENCE_END.search(flat)
    return flat[:end.end()] if end else flat
