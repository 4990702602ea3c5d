"""What ``skyrl envs --catalog ID`` and ``skyrl check ID --catalog`` print."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import typer

from skyrl_core.catalog import catalog_entries
from skyrl_core.scorecard import ScoreRow, score_catalog


def print_catalog(env_id: str, as_json: bool) -> None:
    """The peer envs of ``env_id``'s catalogue: a table, or JSON records."""
    entries = catalog_entries(env_id)
    if as_json:
        typer.echo(json.dumps([entry.to_dict() for entry in entries], indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{env_id}: {len(entries)} envs (run one with env.name=NAME)")
    for column in ("name", "turns", "reward range", "tags", "description"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        turns = str(entry.max_turns) if entry.max_turns is not None else ("multi" if entry.multi_turn else "1")
        span = "-" if entry.reward_range is None else f"{entry.reward_range[0]:g}..{entry.reward_range[1]:g}"
        table.add_row(escape(entry.name), turns, span, escape(", ".join(entry.tags)), escape(entry.description))
    Console().print(table)


def print_scorecard(env_id: str, options: Mapping[str, Any], names: Sequence[str] | None, *, adversarial: bool,
                    quick: bool, n_tasks: int, seed: int, skip: Sequence[str], timeout_s: float,
                    as_json: bool) -> bool:
    """Score the catalogue with a progress bar and print one row per env; True when every env is ok."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        scoring = bar.add_task(f"checking {env_id}", total=None)

        def advance(done: int, total: int, name: str) -> None:
            bar.update(scoring, completed=done, total=total, description=f"checking {env_id}: {name}")

        rows = score_catalog(env_id, options, names, adversarial=adversarial, quick=quick, n_tasks=n_tasks,
                             seed=seed, skip=skip, timeout_s=timeout_s, progress=advance)
    if as_json:
        typer.echo(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        _table(env_id, rows, adversarial)
    return all(row.ok for row in rows)


def _table(env_id: str, rows: list[ScoreRow], adversarial: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{env_id}: scorecard of {len(rows)} env(s)")
    for column in ("env", "conformance", "probes flagged", "gold", "seconds"):
        table.add_column(column, overflow="fold")
    for row in rows:
        conformance = row.conformance + (f" ({len(row.failed)})" if row.failed else "")
        flagged = ", ".join(row.flagged) or ("none" if row.probed else "-")
        table.add_row(escape(row.name), conformance, escape(flagged), row.gold, f"{row.seconds:.1f}")
    Console().print(table)  # the terminal's width: cells fold rather than overflow it
    for row in rows:
        lines = ([f"error: {row.error}"] if row.error else []) + [f"check {f}" for f in row.failed] + row.reasons
        if lines:
            typer.echo(f"\n{row.name}:")
            for line in lines:
                typer.echo(f"  - {line[:300]}")
    passing = sum(row.conformance == "pass" for row in rows)
    summary = [f"{passing} of {len(rows)} pass conformance",
               f"{sum(row.gold == 'reached' for row in rows)} reach their gold",
               f"{sum(bool(row.error) for row in rows)} could not be checked"]
    if adversarial:
        summary.insert(1, f"{sum(bool(row.flagged) for row in rows)} flagged by the probes")
    typer.echo("\n" + "; ".join(summary))
