"""Help texts at 80 columns: ``skyrl --help`` and every (sub-)command's ``--help``, plugins' included,
fit the terminal, never cut or split an option name, and list each command with a whole sentence."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from skyrl_core.cli import build_app
from skyrl_core.cli_help import first_sentence

SKYRL = Path(sys.executable).with_name("skyrl")
OPTION_TOKEN = re.compile(r"(?<![\w-])--[\w-]*…?")
FOREIGN_FLAGS = {"--from", "--resources"}  # other tools' flags that help texts name (COPY --from, ray start)


def command_tree() -> dict[tuple[str, ...], Any]:
    """Every command and group of the CLI by its path (the root: ``()``)."""
    tree: dict[tuple[str, ...], Any] = {}

    def walk(path: tuple[str, ...], command: Any) -> None:
        tree[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk((*path, name), sub)

    walk((), typer.main.get_command(build_app()))
    return tree


TREE = command_tree()
ALL_OPTIONS = {opt for command in TREE.values() for param in command.params
               for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")} | {"--help"}


def help_at_80_columns(path: tuple[str, ...]) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run([str(SKYRL), *path, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def command_entries(text: str) -> dict[str, str]:
    """The "Commands:" section: each command's description, its wrapped lines joined."""
    section = text.partition("\nCommands:\n")[2]
    entries: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        if not line.strip():
            break
        match = re.match(r"  (\S+)\s+(.*)", line)
        if match and not line.startswith("   "):
            name, entries[match[1]] = match[1], match[2]
        else:
            entries[name] += " " + line.strip()
    return entries


@pytest.mark.parametrize("path", sorted(TREE), ids=lambda path: " ".join(path) or "skyrl")
def test_help_fits_80_columns_and_keeps_option_names_whole(path):
    text = help_at_80_columns(path)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    own = {opt for param in TREE[path].params for opt in (*param.opts, *param.secondary_opts)}
    for opt in own - {"--help"}:
        if opt.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), f"{opt} missing or cut in:\n{text}"
    for token in OPTION_TOKEN.findall(text):
        assert token in ALL_OPTIONS | FOREIGN_FLAGS, f"{token!r} is no option name (cut?) in:\n{text}"


@pytest.mark.parametrize("path", sorted(p for p, c in TREE.items() if getattr(c, "commands", None)),
                         ids=lambda path: " ".join(path) or "skyrl")
def test_command_lists_give_whole_sentences(path):
    entries = command_entries(help_at_80_columns(path))
    assert set(entries) == {name for name, sub in TREE[path].commands.items() if not sub.hidden}
    for name, description in entries.items():
        assert description.endswith(".") and not description.endswith("..."), f"{name}: {description!r}"


def test_first_sentence_ends_at_a_full_stop_not_at_an_abbreviation():
    assert first_sentence("Print plugins (e.g. skyrl-search's\n    retrievers) as JSON. Then more.") == \
        "Print plugins (e.g. skyrl-search's retrievers) as JSON."
    assert first_sentence("Check an env, i.e. its contract.\n\nDetails.") == "Check an env, i.e. its contract."
