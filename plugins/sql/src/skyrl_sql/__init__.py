"""skyrl-sql: multi-turn text-to-SQL against a real database, in SkyRL-SQL's format."""

from skyrl_core import EnvSpec, hookimpl


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
    ))
