"""skyrl plugin hooks: ``skyrl tinker serve``."""

from __future__ import annotations

from typing import Any

from skyrl_core import hookimpl


@hookimpl
def register_commands(cli: Any) -> None:
    from skyrl_tinker.cli import build_app

    cli.add_typer(build_app(), name="tinker")
