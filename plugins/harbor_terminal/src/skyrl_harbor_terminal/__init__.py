"""skyrl-harbor-terminal: Harbor-format terminal tasks in real containers, rewarded by each task's verifier."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, hookimpl

if TYPE_CHECKING:
    import typer
    from skyrl_core.probe import Probe


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="harbor_terminal",
        entry_point="skyrl_harbor_terminal.env:HarborTerminalEnv",
        config="skyrl_harbor_terminal.config:HarborTerminalConfig",
        description="Harbor/Terminal-Bench tasks: shell commands in a task container, scored by the task's tests.",
        max_turns=16,
        needs_docker=True,
        eval_splits={},  # one set of tasks (env.tasks) for every split: a run evaluates on its training tasks
        # Training leaves out tasks whose reward a policy could forge; `skyrl eval`/`rollout` play them, marked.
        rollout_defaults={"env": {"forgeable_tasks": "include"}},
    ))


@hookimpl
def register_commands(cli: typer.Typer) -> None:
    from .cli import build_app  # typer only; the command bodies import the rest

    cli.add_typer(build_app(), name="harbor")


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    from .probes import PROBES  # imported when the checker runs, not for every `skyrl` command

    for probe in PROBES:
        register(probe)
