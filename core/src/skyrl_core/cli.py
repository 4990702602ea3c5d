"""The ``skyrl`` command line: list components, check envs, run rollouts and training."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import NoSuchOption
except ImportError:  # pragma: no cover - an older typer on click itself
    from click.exceptions import NoSuchOption

from skyrl_core.cli_help import help_format
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.registry import KINDS, Kind, Registry, RegistryError

OVERRIDES_HELP = "Dotted config overrides such as generator.temperature=0.2 env.max_turns=4 (values parsed as YAML)."


def build_app() -> typer.Typer:
    """The CLI, including sub-commands added by plugins through ``register_commands``."""
    app = typer.Typer(help="SkyRL: train LLM agents with RL. Environments, generators, trainers and "
                      "engines come from plugins.", no_args_is_help=True, add_completion=False, **help_format())
    app.callback()(_main_options)
    app.command("plugins", short_help="Print installed plugins as JSON: versions, hooks, errors, clashes.")(
        plugins_command)
    app.command("envs", help="List installed envs; with --catalog ID, the peer envs a bridge hosts.",
                short_help="List installed envs, or the peer envs a bridge hosts.")(envs_command)
    for kind in KINDS[1:]:
        app.command(f"{kind}s", help=f"List installed {kind}s.")(_listing_command(kind))
    app.command("check", short_help="Check an env: conformance, hacking probes or a dataset's gold.")(check_command)
    app.command("rollout", cls=OverrideHintCommand,
                short_help="Play episodes without training and write them to JSONL.")(rollout_command)
    app.command("eval", cls=OverrideHintCommand,
                short_help="Evaluate a model on an env and keep the results.")(eval_command)
    app.command("run", cls=OverrideHintCommand, short_help="Train a policy on an env.")(run_command)
    app.command("node-resources", short_help="Print this machine's Ray resources for env workers.")(
        node_resources_command)
    from skyrl_core.scaffold import new_app

    app.add_typer(new_app(), name="new")
    get_plugin_manager().register_commands(app)
    return app


class OverrideHintCommand(TyperCommand):
    """A command whose "No such option" error names the dotted override a config field takes instead
    (``--steps 2``: ``trainer.steps=2``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            hint = override_hint(exc.option_name, given)
            if hint:
                exc.message = f"{exc.message.rstrip('.')}. {hint}"
                exc.possibilities = None  # click's close matches (often just --help) only distract from it
            raise


def override_hint(option: str, args: list[str]) -> str | None:
    """``"Config options are overrides: trainer.steps=2"`` when ``--steps`` names a field of a config
    section (installed components' and the run section's), else ``None``."""
    keys = config_keys_named(option.lstrip("-").replace("-", "_"))
    if not keys:
        return None
    value = _value_after(option, args) or "VALUE"
    return "Config options are overrides (no dashes): " + " or ".join(f"{key}={value}" for key in keys) + "."


def _value_after(option: str, args: list[str]) -> str | None:
    """The value ``option`` was given in ``args`` (``--steps 2`` or ``--steps=2`` -> ``2``), if any."""
    for index, arg in enumerate(args):
        if arg.startswith(option + "="):
            return arg.partition("=")[2] or None
        if arg == option and index + 1 < len(args) and not args[index + 1].startswith("-"):
            return args[index + 1]
    return None


def config_keys_named(field: str) -> list[str]:
    """``section.field`` for every config section with an option ``field`` (any installed component of the
    section's kind; ``run``), in section order."""
    from skyrl_core.config import SECTIONS, RunOptions
    from skyrl_core.factory import config_fields

    registry = get_plugin_manager().registry
    keys = []
    for section, kind in SECTIONS.items():
        for spec in registry.listing(kind):
            try:
                fields = config_fields(kind, spec.id, registry)
            except Exception:  # noqa: BLE001 - a hint must not fail on a plugin that does not load
                continue
            if field in fields:
                keys.append(f"{section}.{field}")
                break
    if field in RunOptions.model_fields:
        keys.append(f"run.{field}")
    return keys


def main() -> None:
    build_app()()


def _print_version(value: bool) -> None:
    if not value:
        return
    from skyrl_core.versions import version_lines

    for line in version_lines(get_plugin_manager()):
        typer.echo(line)
    raise typer.Exit()


def _main_options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the skyrl-core version and each installed plugin distribution's, then exit."),
) -> None:
    pass


def _fail(message: str, code: int = 2) -> typer.Exit:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def plugins_command(all: bool = typer.Option(False, "--all", help="Include core's built-in plugin.")) -> None:
    """Print installed plugins as JSON: name, version, module, hooks, the error of any that failed, the
    ids each shares with another plugin (clashes) and the entry points other packages installed in its own
    groups (extensions, e.g. skyrl-search's retrievers)."""
    records = get_plugin_manager().records(include_builtins=all)
    typer.echo(json.dumps([r.to_dict() for r in records], indent=2))
    for message in sorted({m for r in records for m in r.clashes}):
        typer.echo(f"clash: {message}", err=True)


def node_resources_command(
    sweep: bool = typer.Option(False, "--sweep", help="Also remove what dead processes left on this machine "
                               "(sandbox containers, folders, cgroups) and print what was removed on stderr."),
) -> None:
    """Print this machine's Ray resources for env workers as JSON, for `ray start --resources "$(skyrl
    node-resources)"`: one entry per sandbox backend that works here (plugins' node_resources hook)."""
    from skyrl_core.nodes import node_resources, sweep_orphans

    if sweep:
        typer.echo(json.dumps(sweep_orphans()), err=True)
    typer.echo(json.dumps(node_resources()))


def _listing_command(kind: Kind) -> Any:
    def listing(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
        registry = get_plugin_manager().registry
        rows = []
        for spec in registry.listing(kind):
            provider = spec.provider
            rows.append({"id": spec.id, "provider": provider.name, "version": provider.version,
                         "description": spec.description, "clash": spec.id in registry.clashes[kind],
                         **spec.metadata()})
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        # two columns of two parts each (what it is, then which package gives it or what it needs): the
        # description gets most of the width, so a row stays a few lines tall at 80 columns
        table = Table(title=f"{kind}s", show_lines=True)
        table.add_column("id / package", overflow="fold", max_width=26)  # wrapped, never cut
        table.add_column("description / metadata", overflow="fold", ratio=1)
        for row in rows:
            name = row["id"] + (" (CLASH)" if row["clash"] else "")
            metadata = compact_metadata(row)
            table.add_row(Text.assemble((name, "bold"), "\n", (f"{row['provider']} {row['version']}", "dim")),
                          Text.assemble(row["description"], *(("\n", (metadata, "dim")) if metadata else ())))
        Console().print(table)
        for spec_id in sorted(registry.clashes[kind]):
            typer.echo(f"clash: {registry.clash_message(kind, spec_id)}", err=True)
        failures = get_plugin_manager().failures
        if failures:
            typer.echo(f"{len(failures)} plugin(s) failed to load; see `skyrl plugins`.", err=True)

    listing.__doc__ = f"List installed {kind}s with the package that provides each."
    return listing


LISTING_COLUMNS = ("id", "provider", "version", "description", "clash")
METADATA_NAMES = {"reward_range": "reward", "default_generator": "generator"}


def compact_metadata(row: dict[str, Any]) -> str:
    """A listing row's metadata in one short cell: ``max_turns=4, reward=-1..1, stop=</sql>|</solution>,
    needs_docker``. Flags that are off, empty values and mappings (run_defaults, eval_splits) are left
    out; ``--json`` has them all. A catalogue shows as ``catalog`` (``skyrl envs --catalog ID`` lists it)."""
    parts = []
    for key, value in row.items():
        if key in LISTING_COLUMNS or value in (None, False, "", [], ()) or isinstance(value, dict):
            continue
        parts.append(_metadata_part(key, value))
    return ", ".join(parts)


def _metadata_part(key: str, value: Any) -> str:
    """One ``key=value`` of :func:`compact_metadata` (a flag that is on: its name alone)."""
    if value is True or key == "catalog":
        return key
    name = METADATA_NAMES.get(key, key)
    if key == "reward_range" and isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{name}={value[0]:g}..{value[1]:g}"
    if isinstance(value, (list, tuple)):
        return f"{name}={'|'.join(map(str, value))}"
    return f"{name}={value}"


def envs_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    catalog: str | None = typer.Option(None, "--catalog", metavar="ID", help="List the envs of this bridge's "
                                       "catalogue (e.g. reasoning_gym), each runnable with env.name=NAME."),
) -> None:
    """List installed envs with the package that provides each; with --catalog ID, the peer envs that env id
    hosts (a bridge to another ecosystem)."""
    if catalog is None:
        _listing_command("env")(as_json)
        return
    from skyrl_core.catalog_cli import print_catalog

    try:
        print_catalog(catalog, as_json)
    except RegistryError as exc:
        raise _fail(str(exc)) from None


def check_command(
    env_id: str = typer.Argument(..., help="Registered env id, e.g. rlm_repl."),
    n_tasks: int = typer.Option(2, "--n-tasks", "--tasks", min=0, help="Built-in dataset rows to check the prompt "
                                "and gold actions on, or to play the probes on with --adversarial (0 = all)."),
    all_rows: bool = typer.Option(False, "--all-rows", help="Check every row of the built-in dataset: first that "
                                  "each row's prompt builds (before any episode), then that its gold actions reach "
                                  "the top of the reward range; failing rows are named as 'row N' (1-based, as in "
                                  "every message about a dataset row). Same as --n-tasks 0."),
    skip: list[str] | None = typer.Option(None, "--skip", help="A check (or family: determinism, gold, episode, "
                                          "gymnasium, ...) that cannot hold for this env, e.g. an LLM judge's "
                                          "determinism; with --adversarial, a probe; repeatable."),
    adversarial: bool = typer.Option(False, "--adversarial", help="Play hostile scripted policies (probes) instead "
                                     "and flag any that scores above the null agent, raises, ends as an env error "
                                     "or leaks state across episodes (skyrl_core.testing.check_adversarial)."),
    quick: bool = typer.Option(False, "--quick", help="With --adversarial: a subset of the generic probes (for CI)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every episode."),
    as_json: bool = typer.Option(False, "--json", help="With --adversarial or --dataset: print the report as JSON."),
    dataset: Path | None = typer.Option(None, "--dataset", help="Report on this dataset instead: every task's gold "
                                        "actions are played and a table says, per task, its oracle reward and what "
                                        "is wrong (plus the env's own columns); exit 1 when a task fails. PATH goes "
                                        "to the env's dataset option (harbor_terminal: env.tasks), else it is a "
                                        "JSONL file of task rows."),
    concurrency: int = typer.Option(2, "--concurrency", min=1, help="With --dataset: oracle episodes run at once."),
    catalog: bool = typer.Option(False, "--catalog", help="Score every env of this bridge's catalogue (or --names): "
                                 "conformance, and with --adversarial the probes, one row per peer env with the "
                                 "probes flagged and why, whether the gold is reached, and seconds; exit 1 when any "
                                 "env fails or is flagged."),
    names: str | None = typer.Option(None, "--names", help="With --catalog: only these envs, comma-separated."),
    timeout: float = typer.Option(300.0, "--timeout", min=1, help="With --catalog: seconds one env may take "
                                  "before its row says it timed out."),
    overrides: list[str] | None = typer.Argument(None, help="Env config overrides: env.max_turns=3."),
) -> None:
    """Run the env conformance checker (skyrl_core.testing.check_env) and print each check, and each warning
    its dataset raised (WARN lines, which never fail the check); with --adversarial, the reward-hacking probes;
    with --dataset, a per-task oracle report on that dataset; with --catalog, a scorecard of a bridge's envs."""
    from skyrl_core.config import parse_overrides
    from skyrl_core.testing import check_adversarial, check_env

    try:
        env_options = parse_overrides(overrides or []).get("env", {})
        if catalog:
            from skyrl_core.catalog_cli import print_scorecard

            chosen = [name.strip() for name in names.split(",") if name.strip()] if names else None
            ok = print_scorecard(env_id, env_options, chosen, adversarial=adversarial, quick=quick,
                                 n_tasks=0 if all_rows else n_tasks, seed=seed, skip=list(skip or ()),
                                 timeout_s=timeout, as_json=as_json)
            if not ok:
                raise typer.Exit(1)
            return
        if dataset is not None:
            _dataset_check(env_id, env_options, dataset, concurrency=concurrency, seed=seed, as_json=as_json)
            return
        if adversarial:
            from rich.console import Console
            from rich.progress import Progress

            with Progress(console=Console(stderr=True), transient=True) as bar:
                probing = bar.add_task(f"probing {env_id}", total=None)
                found = check_adversarial(env_id, config=env_options, n_tasks=0 if all_rows else n_tasks, seed=seed,
                                          quick=quick, skip=set(skip or ()),
                                          progress=lambda done, total: bar.update(probing, completed=done, total=total))
            _print_adversarial(found, as_json)
            if not found.ok:
                raise typer.Exit(1)
            return
        report = check_env(env_id, config=env_options, n_tasks=0 if all_rows else n_tasks, skip=set(skip or ()),
                           seed=seed, raise_on_failure=False)
    except (RegistryError, ValueError) as exc:  # a bad env.* value (ConfigError) or --skip name
        raise _fail(str(exc)) from None
    for name in report.passed:
        typer.echo(f"PASS  {report.label(name)}")
    for name in report.skipped:
        typer.echo(f"SKIP  {report.label(name)}")
    for warning in report.warnings:
        typer.echo(f"WARN  {warning}")
    for problem in report.failed:
        typer.echo(f"FAIL  {problem}")
    if report.bad_rows:
        typer.echo(f"bad rows ({len(report.bad_rows)}): {', '.join(report.bad_rows)}")
    summary = f"{len(report.passed)} passed, {len(report.failed)} failed, {len(report.skipped)} skipped"
    typer.echo(summary + (f", {len(report.warnings)} warning(s)" if report.warnings else ""))
    if report.failed:
        raise typer.Exit(1)


def _dataset_check(env_id: str, options: dict[str, Any], dataset: Path, *, concurrency: int, seed: int,
                   as_json: bool) -> None:
    """``skyrl check ENV --dataset PATH``: the oracle on every task, one table row each."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from skyrl_core.config import merge
    from skyrl_core.dataset_report import dataset_report
    from skyrl_core.factory import env_class

    registry = get_plugin_manager().registry
    cls = env_class(env_id, registry)
    options = merge(registry.get("env", env_id).rollout_defaults.get("env", {}), options)  # played, not trained on
    with Progress(console=Console(stderr=True), transient=True) as bar:
        playing = bar.add_task(f"oracle on {dataset}", total=None)
        report = dataset_report(cls, env_id, options, dataset, registry, concurrency=concurrency, seed=seed,
                                progress=lambda done, total: bar.update(playing, completed=done, total=total))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        for warning in report.warnings:
            typer.echo(f"WARN  {warning}")
        table = Table(title=f"{env_id}: {dataset}")
        rows = report.rows()
        for column in rows[0]:
            table.add_column(column, no_wrap=column == "task", overflow="fold")
        for row in rows:
            cells = [f"{value:g}" if isinstance(value, float) else str(value) for value in row.values()]
            cells[-1] = cells[-1] if len(cells[-1]) <= 100 else cells[-1][:99] + "…"  # in full below the table
            table.add_row(*map(escape, cells))
        Console().print(table)
        for result in report.failed:
            typer.echo(f"  {result.task_name}: {result.problem(report.reward_range)}")
        typer.echo(f"{len(rows) - len(report.failed)} of {len(rows)} task(s) solved by their oracle at reward "
                   f"{report.reward_range[1]:g}" + (f"; failed: {', '.join(r.task_name for r in report.failed)}"
                                                    if report.failed else ""))
    if report.failed:
        raise typer.Exit(1)


def _print_adversarial(report: Any, as_json: bool) -> None:
    """The probes' table, each flag with its example, and a closing count (or all of it as JSON)."""
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return

    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    typer.echo(f"{report.env}: {len(report.outcomes)} probes on {len(report.tasks)} task(s): {', '.join(report.tasks)}")
    typer.echo(f"{'probe':<18} {'tasks':>5} {'reward':>7} {'null':>7} {'gold':>7} {'success':>7}  verdict")
    for outcome in report.outcomes:
        row = outcome.summary()
        verdict = "FLAGGED" if outcome.flags else "ok"
        typer.echo(f"{row['probe']:<18} {row['tasks']:>5} {number(row['mean_reward']):>7} {number(row['null']):>7} "
                   f"{number(row['gold']):>7} {number(row['success']):>7}  {verdict}")
    for outcome in report.flagged:
        typer.echo(f"\nFLAG  {outcome.probe}: {outcome.about}")
        for why in outcome.flags:
            typer.echo(f"  - {why}")
        if outcome.example:
            typer.echo(f"  action:      {outcome.example['action']!r}")
            typer.echo(f"  observation: {outcome.example['observation']!r}")
    for leak in report.leaks:
        typer.echo(f"\nFLAG  state leak: {leak}")
    by_reason: dict[str, list[str]] = {}
    for name, reason in {**report.exempt, **report.skipped}.items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        typer.echo(f"SKIP  {', '.join(names)}: {reason}")
    flagged = len(report.flagged) + (1 if report.leaks else 0)
    typer.echo(f"{len(report.outcomes) - len(report.flagged)} passed, {flagged} failed, "
               f"{len(report.exempt) + len(report.skipped)} skipped")


def _config_layers(env: str | None, config_file: Path | None, overrides: list[str] | None,
                   flags: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    from skyrl_core.config import load_yaml, parse_overrides

    layers: list[dict[str, Any]] = [load_yaml(config_file)] if config_file else []
    layers.append({**({"env": {"id": env}} if env else {}), **{k: v for k, v in flags.items() if v}})
    layers.append(parse_overrides(overrides or []))
    return layers


def _rollout_split(split: str | None, layers: list[dict[str, Any]], tasks: Path | None) -> str:
    """``--split``, else the split a run of the env evaluates on (named on stderr when the rows come from it)."""
    if split is not None:
        return split
    from skyrl_core.held_out import default_split

    chosen, why = default_split(layers, get_plugin_manager().registry)
    if tasks is None:
        typer.echo(f"split: {chosen} ({why}; --split chooses another)", err=True)
    return chosen


def rollout_command(
    env: str = typer.Option(..., "--env", help="Env id (see `skyrl envs`)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine id (see `skyrl engines`); default: the "
                                      "config's, else 'hf'. Unused with --oracle."),
    model: str | None = typer.Option(None, "--model", help="Model name or path for the engine. Unused with --oracle."),
    generator: str | None = typer.Option(None, "--generator", help="Generator id; default: the env's own or "
                                         "'default'. Unused with --oracle."),
    n_tasks: int = typer.Option(8, "--n-tasks", min=0, help="Tasks to run (0 = all)."),
    samples: int | None = typer.Option(None, "--samples", min=1, help="Episodes per task; default: the config's "
                                       "generator.n_samples_per_prompt when it sets one, else 1. Unused with --oracle."),
    split: str | None = typer.Option(None, "--split", help="Built-in dataset split; default: the one a run of the "
                                     "env evaluates on (trainer.eval_split, else the env's held-out split for "
                                     "trainer.data_split; rlm_repl: starter_test)."),
    tasks: Path | None = typer.Option(None, "--tasks", help="JSONL file of task rows instead of the built-in data."),
    out: Path = typer.Option(Path("rollouts.jsonl"), "--out", help="Where to write the trajectories (JSONL); an "
                             "existing file is refused unless --overwrite is given."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the --out file if it exists."),
    config_file: Path | None = typer.Option(None, "--config", help="YAML run config."),
    oracle: bool = typer.Option(False, "--oracle", help="Play the env's gold actions instead of a model (no engine, "
                                "model or tokenizer is loaded); write one result per task to --out and exit 1 "
                                "naming every task that does not reach the top of the env's reward_range."),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Oracle episodes run at once (with --oracle)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config as YAML and exit "
                                      "(no engine, model or data is loaded)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP),
) -> None:
    """Run episodes without training, write trajectories to JSONL and print a reward summary.

    With --oracle, the env's own gold actions play every task instead of a model: a check that the
    shipped tasks are solvable, and that the env scores a right solution at full reward.

    The env's run_defaults (as `skyrl run` has them, but for the GRPO group size) come first; --config,
    flags and overrides replace them.
    """
    from skyrl_core.data import DataError
    from skyrl_core.engine import EngineError
    from skyrl_core.factory import ConfigError
    from skyrl_core.held_out import rollout_defaults
    from skyrl_core.rollouts import play_rollout, prepare_rollout

    flags = {"engine": {**({"id": engine} if engine else {}), **({"model": model} if model else {})},
             "generator": {"id": generator} if generator else {}}
    if print_config:
        _echo_episode_config(env, config_file, overrides, flags)
        return
    if oracle:
        unused = [flag for flag, value in (("--engine", engine), ("--model", model), ("--generator", generator),
                                           ("--samples", samples)) if value]
        _oracle_rollout(env, n_tasks=n_tasks, split=split, tasks=tasks, out=out, config_file=config_file,
                        overrides=overrides, concurrency=concurrency, unused=unused, overwrite=overwrite)
        return
    try:
        layers = _config_layers(env, config_file, overrides, flags)
        layers = [rollout_defaults(layers, get_plugin_manager().registry), *layers]
        rollout = prepare_rollout(layers, split=_rollout_split(split, layers, tasks), tasks=tasks,
                                  n_tasks=n_tasks, samples=samples)
    except (ConfigError, RegistryError, DataError, EngineError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None
    if rollout.note:
        typer.echo(rollout.note, err=True)
    _refuse_overwrite(out, overwrite)  # after the config and tasks: their errors come first
    batch = play_rollout(rollout)
    batch.to_jsonl(out)
    from rich.console import Console

    from skyrl_core.metrics import format_metrics_table

    Console().print(format_metrics_table("rollout summary", batch.metrics))
    typer.echo(f"wrote {len(batch)} trajectories to {out}")
    episodes = batch.roots()
    if episodes and all(t.error is not None for t in episodes):
        raise _fail(f"all {len(episodes)} episodes failed; the first: {episodes[0].error.splitlines()[0]}", code=1)


def _refuse_overwrite(out: Path, overwrite: bool) -> None:
    """Stop before any episode is played (after the config and tasks are read) when ``out`` is a folder, or exists and ``--overwrite`` was not given."""
    if out.is_dir():
        raise _fail(f"--out {out} is a folder; name a file (JSONL) to write the trajectories to")
    if out.exists() and not overwrite:
        raise _fail(f"{out} already exists; choose another file with --out PATH, or pass --overwrite to replace it")


def _oracle_rollout(env: str, *, n_tasks: int, split: str | None, tasks: Path | None, out: Path,
                    config_file: Path | None, overrides: list[str] | None, concurrency: int,
                    unused: list[str], overwrite: bool) -> None:
    """``skyrl rollout --oracle``: play every row's gold actions, report and write the results."""
    import asyncio

    from rich.console import Console
    from rich.markup import escape

    from skyrl_core.config import merge
    from skyrl_core.data import DataError, load_tasks
    from skyrl_core.factory import ConfigError, component_config, env_class
    from skyrl_core.held_out import rollout_defaults
    from skyrl_core.oracle import play_gold
    from skyrl_core.rollouts import RolloutProgress

    if unused:
        typer.echo(f"note: --oracle plays the env's gold actions; {', '.join(unused)} "
                   f"{'is' if len(unused) == 1 else 'are'} not used", err=True)
    registry = get_plugin_manager().registry
    try:
        env_section = _oracle_env_section(env, config_file, overrides)
        layers = _config_layers(env, config_file, overrides, {})
        env_section = merge(rollout_defaults(layers, registry).get("env", {}), env_section)  # as a model rollout
        env_config = component_config("env", env, env_section, registry)
        cls = env_class(env, registry)
        split = _rollout_split(split, layers, tasks)
        rows = load_tasks(cls, env_config, split=split, path=str(tasks) if tasks else None, limit=n_tasks or None)
    except (ConfigError, RegistryError, DataError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None
    if not rows:
        raise _fail(f"no tasks to run for env {env!r} (split {split!r})")
    _refuse_overwrite(out, overwrite)
    with RolloutProgress(len(rows), "oracle episodes") as progress:
        results = asyncio.run(play_gold(cls, env_config, rows, concurrency=concurrency,
                                        on_result=lambda _result: progress.advance()))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for result in results:
            f.write(json.dumps({"env": env, **result.to_dict()}) + "\n")
    from rich.table import Table

    table = Table(title=f"oracle: {env}")
    for column in ("task", "reward", "turns", "end", "error"):
        table.add_column(column)
    for result in results:
        error = result.error or ""
        table.add_row(escape(result.task_name), f"{result.reward:g}", str(result.turns), result.end,
                      escape(error if len(error) <= 80 else error[:77] + "..."))
    Console().print(table)
    reward_range = cls.reward_range_for(env_config)
    failed = [r for r in results if r.problem(reward_range) is not None]
    typer.echo(f"wrote {len(results)} oracle episodes to {out}")
    if failed:
        for r in failed:
            typer.echo(f"  {r.task_name}: {r.problem(reward_range)}")
        typer.echo(f"oracle failed on {len(failed)} task(s): {', '.join(r.task_name for r in failed)}")
        raise typer.Exit(1)
    ceilings = sorted({result.target(reward_range) for result in results})
    at = f"reward {ceilings[0]:g}" if len(ceilings) == 1 else "their ceilings (" + ", ".join(f"{c:g}" for c in ceilings) + ")"
    typer.echo(f"oracle solved all {len(results)} task(s) at {at}")


def _oracle_env_section(env: str, config_file: Path | None, overrides: list[str] | None) -> dict[str, Any]:
    """The ``env`` options of the run config (YAML file, then overrides); other sections are unused."""
    from skyrl_core.config import SECTIONS, load_yaml, merge, parse_overrides
    from skyrl_core.factory import ConfigError
    from skyrl_core.registry import did_you_mean

    raw: dict[str, Any] = load_yaml(config_file) if config_file else {}
    raw = merge(raw, parse_overrides(overrides or []))
    allowed = [*SECTIONS, "run"]
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"unknown config section {key!r}.{did_you_mean(key, allowed)} "
                              f"Sections: {', '.join(allowed)}")
    section = raw.get("env", {})
    if not isinstance(section, dict):
        raise ConfigError(f"config section 'env' must be a mapping, got {section!r}")
    return {k: v for k, v in section.items() if k != "id"}


def eval_command(
    env: str = typer.Option(..., "--env", help="Env id (see `skyrl envs`)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine id (see `skyrl engines`); default: the "
                                      "config's, else 'hf'."),
    model: str | None = typer.Option(None, "--model", help="Model name or path for the engine (engine.model)."),
    generator: str | None = typer.Option(None, "--generator", help="Generator id; default: the env's own or "
                                         "'default'."),
    n_tasks: int = typer.Option(8, "--n-tasks", min=0, help="Tasks to evaluate (0 = all)."),
    samples_per_task: int | None = typer.Option(None, "--samples-per-task", min=1, help="Episodes per task, the n of "
                                                "pass@k; default: the config's generator.n_samples_per_prompt when "
                                                "--config or an override sets one, else 1."),
    split: str | None = typer.Option(None, "--split", help="Built-in dataset split; default: the one a run of the "
                                     "env evaluates on (trainer.eval_split, else the env's held-out split for "
                                     "trainer.data_split; rlm_repl: starter_test)."),
    tasks: Path | None = typer.Option(None, "--tasks", help="JSONL file of task rows instead of the built-in data."),
    show: int = typer.Option(5, "--show", min=0, help="Episodes shown one by one in the per-sample table (0: none)."),
    pass_threshold: float | None = typer.Option(None, "--pass-threshold", help="Reward at which an episode passes, "
                                                "for pass@k; default: the top of the env's reward_range."),
    out: Path | None = typer.Option(None, "--out", help="Results folder; default: evals/<env>-<model>-<time>. One "
                                    "that already holds results is refused."),
    config_file: Path | None = typer.Option(None, "--config", help="YAML run config."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config as YAML and exit "
                                      "(no engine, model or data is loaded)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP),
) -> None:
    """Evaluate a model on an env: the first episodes one by one, pass@k and mean@k per task, the summary,
    and a results folder (config, samples, metrics, per-task table) that `skyrl view` opens.

    The env's run_defaults (as `skyrl run` has them) come first; --config, flags and overrides replace them.
    """
    from rich.console import Console

    from skyrl_core.data import DataError
    from skyrl_core.engine import EngineError
    from skyrl_core.evaluate import plan_evaluation, run_evaluation
    from skyrl_core.factory import ConfigError

    flags = {"engine": {**({"id": engine} if engine else {}), **({"model": model} if model else {})},
             "generator": {"id": generator} if generator else {}}
    if print_config:
        _echo_episode_config(env, config_file, overrides, flags)
        return
    try:
        evaluation = plan_evaluation(_config_layers(env, config_file, overrides, flags), split=split, tasks=tasks,
                                     n_tasks=n_tasks, samples=samples_per_task, out=out, pass_threshold=pass_threshold)
    except (ConfigError, RegistryError, DataError, EngineError, NotImplementedError) as exc:
        raise _fail(str(exc)) from None
    rollout = evaluation.rollout
    if rollout.note:
        typer.echo(rollout.note, err=True)
    why = f" ({evaluation.split_why})" if evaluation.split_why and evaluation.split_why != "--split" else ""
    typer.echo(f"evaluating {evaluation.model} ({rollout.cfg.engine_id}) on {rollout.cfg.env_id}: {len(rollout.rows)} "
               f"task(s) from {evaluation.source}{why}, {rollout.samples} episode(s) each", err=True)
    result = run_evaluation(evaluation, show=show, console=Console())
    typer.echo(f"wrote the evaluation to {result.folder} (open it with: skyrl view {result.folder})")
    if result.all_failed:
        first = result.episodes[0].error or ""
        raise _fail(f"all {len(result.episodes)} episodes failed; the first: {first.splitlines()[0] if first else ''}",
                    code=1)


def run_command(
    env: str | None = typer.Option(None, "--env", help="Env id (see `skyrl envs`); required unless --config sets "
                                   "env.id or --resume continues a run."),
    trainer: str | None = typer.Option(None, "--trainer", help="Trainer id (see `skyrl trainers`), e.g. fsdp_grpo; "
                                       "required unless --config sets trainer.id or --resume continues a run."),
    model: str | None = typer.Option(None, "--model", help="Policy model (sets trainer.model)."),
    config_file: Path | None = typer.Option(None, "--config", help="YAML run config."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this folder, from its saved "
                                       "config.yaml; flags and overrides apply on top (not another model or env)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config as YAML and exit, "
                                      "once the trainer's checks of options against each other pass (nothing is "
                                      "built, no run folder is made)."),
    overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP),
) -> None:
    """Train a policy on an env: resolves env, generator, engine and trainer through the registry.

    Options the env recommends for a run (its spec's run_defaults, shown by `skyrl envs`) come first;
    with --resume, the run's saved config.yaml replaces them; --config, flags and overrides replace both.
    """
    from skyrl_core.data import DataError
    from skyrl_core.engine import EngineError
    from skyrl_core.factory import ConfigError, trainer_class

    try:
        cfg = _run_config(env, trainer, model, config_file, resume, overrides)
        cls = trainer_class(str(cfg.trainer_id))
        check = getattr(cls, "check_config", None)
        if callable(check):  # optional (see skyrl_core.protocols.Trainer)
            check(cfg)
        if print_config:
            _echo_config(cfg)
            return
        summary = cls(cfg).fit()
    except (ConfigError, RegistryError, DataError, EngineError) as exc:
        raise _fail(str(exc)) from None
    from rich.console import Console

    from skyrl_core.held_out import eval_reward_line
    from skyrl_core.metrics import format_metrics_table

    Console().print(format_metrics_table("run summary", summary or {}))
    held_out = eval_reward_line(summary or {})  # the held-out reward before and after training
    if held_out:
        typer.echo(held_out)


def _run_config(env: str | None, trainer: str | None, model: str | None, config_file: Path | None,
                resume: Path | None, overrides: list[str] | None) -> Any:
    """The resolved config of ``skyrl run``: the env's run_defaults, the resumed run's saved config (with
    --resume or run.resume), --config, flags, overrides; later wins."""
    from skyrl_core.config import build_config, dotted_get, env_run_defaults, merge, resumed_run_layer
    from skyrl_core.factory import ConfigError

    flags: dict[str, dict[str, Any]] = {"trainer": {**({"id": trainer} if trainer else {}),
                                                    **({"model": model} if model else {})}}
    if resume:
        flags["run"] = {"resume": str(resume)}
    registry = get_plugin_manager().registry
    layers = _config_layers(env, config_file, overrides, flags)
    saved = resumed_run_layer(layers, registry)
    chosen: dict[str, Any] = {}
    for layer in (saved, *layers):
        chosen = merge(chosen, layer)
    if not dotted_get(chosen, "env.id"):
        raise ConfigError("--env is required (see `skyrl envs`), unless --config sets env.id or --resume RUN_DIR "
                          "continues a run")
    if not dotted_get(chosen, "trainer.id"):
        layers.insert(0, {"trainer": {"id": _only_trainer(registry)}})
    # a resumed run's saved config already holds the env's run_defaults it started with
    base = saved if saved else env_run_defaults(layers, registry)
    return build_config(base, *layers, registry=registry)


def _only_trainer(registry: Registry) -> str:
    """The trainer of a run that names none: the only installed one (said on stderr), else a ConfigError
    saying that ``--trainer`` is required and what is installed."""
    from skyrl_core.factory import ConfigError

    installed = sorted({spec.id for spec in registry.listing("trainer")})
    if len(installed) == 1:
        typer.echo(f"trainer: {installed[0]} (the only one installed; --trainer chooses another)", err=True)
        return installed[0]
    found = (f"{len(installed)} are installed: {', '.join(installed)}" if installed
             else "none is installed; skyrl-trainers provides fsdp_grpo")
    raise ConfigError(f"--trainer is required (see `skyrl trainers`; {found}), unless --config sets trainer.id "
                      "or --resume RUN_DIR continues a run")


def _echo_episode_config(env: str, config_file: Path | None, overrides: list[str] | None,
                         flags: dict[str, dict[str, Any]]) -> None:
    """``skyrl rollout/eval --print-config``: the config their episodes would be played with."""
    from skyrl_core.factory import ConfigError
    from skyrl_core.held_out import rollout_defaults
    from skyrl_core.rollouts import episode_config

    registry = get_plugin_manager().registry
    try:
        layers = _config_layers(env, config_file, overrides, flags)
        cfg, note = episode_config([rollout_defaults(layers, registry), *layers])
    except (ConfigError, RegistryError) as exc:
        raise _fail(str(exc)) from None
    if note:
        typer.echo(note, err=True)
    _echo_config(cfg)


def _echo_config(cfg: Any) -> None:
    """``--print-config``: the resolved config (every section, defaults filled) as YAML on stdout."""
    import yaml

    typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
