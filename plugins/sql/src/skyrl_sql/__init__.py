"""skyrl-sql: multi-turn text-to-SQL against a real database, in SkyRL-SQL's format."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from skyrl_core import EnvSpec, hookimpl

if TYPE_CHECKING:
    from skyrl_core.probe import Probe


@hookimpl
def register_envs(register):
    register(EnvSpec(
        id="sql",
        entry_point="skyrl_sql.env:SQLEnv",
        config="skyrl_sql.config:SQLEnvConfig",
        description="Text-to-SQL: explore a read-only SQLite/DuckDB database with <sql>, submit with <solution>.",
        max_turns=5,
        reward_range=(-1.0, 1.0),
        stop=("</sql>", "</solution>"),
        eval_splits={"train": "test"},  # env.data_files: the file of split 'test' (or set trainer.eval_split)
    ))


@hookimpl
def register_probes(register: Callable[[Probe], None]) -> None:
    from .probes import PROBES  # imported when the checker runs, not for every `skyrl` command

    for probe in PROBES:
        register(probe)
