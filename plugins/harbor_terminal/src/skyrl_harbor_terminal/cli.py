"""``skyrl harbor``: commands about Harbor task datasets (``skyrl harbor images``, ``skyrl harbor export``).

Registered through the plugin's ``register_commands`` hook; everything heavy (the Docker SDK, the
dataset reader) is imported inside the command bodies so that ``skyrl --help`` stays fast.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from skyrl_sandbox.container_engine import ContainerEngine


@dataclass
class ImageRow:
    """One image a dataset needs, and how this machine can have it."""

    image: str
    tasks: list[str] = field(default_factory=list)
    on_engine: bool | None = None  # None: no engine answered
    state: str = ""  # present, local base, substitute, cannot be had
    substitute: str | None = None  # the local tag that stands in for it
    suite: str | None = None
    built: bool | None = None  # the substitute (or local base) is on the engine
    warnings: list[str] = field(default_factory=list)
    problem: str | None = None


def build_app() -> typer.Typer:
    app = typer.Typer(help="Harbor task datasets: the images they need, Harbor-ready copies.", no_args_is_help=True,
                      add_completion=False)
    app.command("images")(images_command)
    app.command("export")(export_command)
    return app


def export_command(
    path: str | None = typer.Argument(None, help="A task folder, a folder of task folders, or a Parquet dataset; "
                                                 "default: the built-in tasks."),
    out: str = typer.Option(..., "--out", help="Folder to write the copies into, one sub-folder per task "
                                                "(named as the task's folder); existing ones are not replaced."),
) -> None:
    """Write Harbor-ready copies of tasks: test helpers copied into tests/, local base images replaced by public
    Debian ones, and the agent user and network stated in Harbor's fields, so Harbor runs them as we do."""
    from .harbor_export import ExportError, export_task

    tasks, problems = _load(path)
    for task in tasks:
        try:
            written = export_task(task.path, Path(out) / task.path.name)
        except (ExportError, ValueError, OSError) as exc:
            problems.append(f"{task.path}: not exported ({exc})")
            continue
        typer.echo(f"exported {task.name} -> {written}")
    for line in problems:
        typer.echo(f"error: {line}", err=True)
    if problems:
        raise typer.Exit(1)


def images_command(
    path: str | None = typer.Argument(None, help="A task folder, a folder of task folders, or a Parquet dataset; "
                                                 "default: the built-in tasks."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    build: bool = typer.Option(False, "--build", help="Build the substitutes and local base images listed that "
                                                      "the engine lacks."),
    backend: str = typer.Option("auto", "--backend", help="The sandbox backend (one that runs images) whose engine "
                                                          "is asked and builds; auto: the first installed."),
) -> None:
    """List the images a dataset's tasks need (each FROM, COPY --from and task.toml docker_image): which the
    engine has, which the offline base-image map builds here (from which Debian suite), which cannot be had."""
    from skyrl_sandbox.backends.docker import images
    from skyrl_sandbox.errors import SandboxError

    try:
        engine = images.image_engine(None if backend == "auto" else backend)
    except SandboxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    tasks, task_problems = _load(path)
    problem = engine.problem()
    rows, read_problems = image_rows(tasks, engine=None if problem else engine)
    task_problems += read_problems
    if problem:
        typer.echo(f"{problem}: which images are on the engine is not shown; what the offline base-image map can "
                   "build is", err=True)
    if build:
        if problem:
            typer.echo(f"error: --build needs a {engine.title}", err=True)
            raise typer.Exit(1)
        if not _build(rows, engine):
            raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps({"images": [asdict(row) for row in rows], "problems": task_problems}, indent=2))
        return
    _print_table(rows, len(tasks))
    for line in task_problems:
        typer.echo(f"problem: {line}")


def _load(path: str | None) -> tuple[list[Any], list[str]]:
    """The dataset's tasks, and why any of its task folders would not load (the others are still listed)."""
    from .dataset import DatasetError, extract_parquet, find_task_dirs
    from .env import BUILTIN_TASKS
    from .task import load_task

    source = Path(path) if path else BUILTIN_TASKS
    try:
        folders = extract_parquet(source) if source.suffix == ".parquet" and source.is_file() else find_task_dirs(source)
    except (DatasetError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    tasks, problems = [], []
    for folder in folders:
        try:
            tasks.append(load_task(folder))
        except (ValueError, OSError) as exc:
            problems.append(f"{folder}: not loaded ({exc})")
    return tasks, problems


def image_rows(tasks: list[Any], *, engine: ContainerEngine | None) -> tuple[list[ImageRow], list[str]]:
    """One row per image the tasks need, in first-use order, and whether ``engine`` has them (None: no engine
    answers); and the tasks whose Dockerfile could not be read."""
    from skyrl_sandbox.backends.docker import images

    from . import substitutes

    rows: dict[str, ImageRow] = {}
    problems: list[str] = []
    for task in tasks:
        environment = task.environment
        refs: list[str] = []
        if environment.context_dir is not None:
            recipe = environment.context_dir / environment.dockerfile
            try:
                refs = [use.ref for use in substitutes.image_uses(recipe.read_text(errors="replace"))]
            except OSError as exc:
                problems.append(f"{task.name}: {recipe} cannot be read ({exc})")
        elif environment.docker_image:
            refs = [environment.docker_image]
        for ref in refs:
            row = rows.get(ref)
            if row is None:
                row = rows[ref] = _classify(ref, engine=engine, images=images, substitutes=substitutes)
            if task.name not in row.tasks:
                row.tasks.append(task.name)
    return list(rows.values()), problems


def _classify(ref: str, *, engine: ContainerEngine | None, images: Any, substitutes: Any) -> ImageRow:
    row = ImageRow(ref)
    if "$" in ref:
        row.state, row.problem = "cannot be had", "names a build argument without a default"
        return row
    row.on_engine = substitutes.on_engine(engine, ref) if engine else None
    if images.declared_base_image(ref) is not None:
        spec = images.declared_base_image(ref)
        row.state, row.suite, row.built = "local base", spec.suite, row.on_engine
        return row
    if row.on_engine:
        row.state = "present"
        return row
    try:
        substitute = substitutes.substitute_for(ref)
    except substitutes.UnavailableImage as exc:
        row.state, row.problem = "cannot be had", str(exc)
        return row
    row.state, row.substitute, row.suite = "substitute", substitute.tag, substitute.suite
    row.built = substitutes.on_engine(engine, substitute.tag) if engine else None
    row.warnings = list(substitute.warnings)
    if not substitutes.substitutes_enabled(None):
        row.warnings.append(f"the map is off ({substitutes.SUBSTITUTE_ENV}=0): builds will not use it")
    if not substitutes.suite_buildable(substitute.suite):
        row.warnings.append(f"Debian {substitute.suite} may not build here (mmdebstrap or its archive key missing)")
    return row


def _build(rows: list[ImageRow], engine: ContainerEngine) -> bool:
    """Build what the rows name and ``engine`` lacks; False when a build failed (its error is printed)."""
    from skyrl_sandbox.backends.docker import images
    from skyrl_sandbox.errors import SandboxError

    from . import substitutes

    ok = True
    for row in rows:
        tag = row.substitute if row.state == "substitute" else row.image if row.state == "local base" else None
        if tag is None or row.built:
            continue
        if row.state == "substitute":
            substitutes.substitute_for(row.image).declare()
        typer.echo(f"building {tag} (for {row.image})")
        try:
            images.ensure_base_image(engine, tag,
                                     progress=lambda line: typer.echo(line) if not line.startswith("  ") else None)
        except SandboxError as exc:
            typer.echo(f"error: {tag} did not build: {exc}", err=True)
            ok = False
            continue
        row.built = True
        if row.state == "local base":
            row.on_engine = True
    return ok


def _print_table(rows: list[ImageRow], n_tasks: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"images needed by {n_tasks} task(s)", title_justify="left", show_lines=False)
    for column in ("image", "tasks", "on engine", "how it is had", "notes"):
        table.add_column(column, overflow="fold")
    for row in rows:
        engine = "?" if row.on_engine is None else "yes" if row.on_engine else "no"
        if row.state == "substitute":
            built = "?" if row.built is None else "built" if row.built else "not built yet"
            how = f"substitute from Debian {row.suite}: {row.substitute} ({built})"
        elif row.state == "local base":
            built = "?" if row.built is None else "built" if row.built else "built on first use"
            how = f"local base image, Debian {row.suite} ({built})"
        elif row.state == "present":
            how = "present"
        else:
            how = "cannot be had"
        problem = (row.problem or "").removeprefix(f"{row.image} cannot be had here: ")
        notes = "; ".join(row.warnings + ([problem] if problem else []))
        tasks = row.tasks[0] if len(row.tasks) == 1 else f"{len(row.tasks)}: {row.tasks[0]}, ..."
        table.add_row(row.image, tasks, engine, how, notes)
    Console(soft_wrap=False).print(table)
