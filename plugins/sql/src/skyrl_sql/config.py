"""Options of the ``sql`` env (section ``env`` of a run config). Every limit has a safe default."""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, field_validator
from skyrl_core import EnvConfig


class SQLEnvConfig(EnvConfig):
    max_turns: int = Field(5, ge=1, description="Turns per episode, the last one included (SkyRL-SQL evaluates with 5).")
    engine: Literal["sqlite", "duckdb"] = Field("sqlite", description="Database engine; duckdb needs the duckdb package.")
    data_files: dict[str, str] = Field(
        default_factory=dict,
        description="Split -> JSON/JSONL/Parquet questions file (Spider/BIRD/SynSQL/SkyRL-SQL rows); "
                    "empty = the built-in dataset.")
    db_root: str | None = Field(None, description="Folder holding <db_id>/<db_id>.sqlite (or .duckdb) databases.")
    cache_dir: str | None = Field(None, description="Where the built-in databases are generated; "
                                                    "default $SKYRL_SQL_CACHE or ~/.cache/skyrl_sql.")
    query_timeout_s: float = Field(5.0, gt=0, description="Time limit of one exploration query.")
    max_rows: int = Field(1000, ge=1, description="Rows fetched per exploration query; more are cut off.")
    max_observation_rows: int = Field(50, ge=1, description="Rows shown in the observation.")
    max_observation_chars: int = Field(9000, ge=100, description="Observation table size cap (characters).")
    reward_timeout_s: float = Field(30.0, gt=0, description="Time limit of the submitted and of the gold query.")
    reward_max_rows: int = Field(100_000, ge=1, description="Rows compared at most when scoring.")
    max_result_bytes: int = Field(16_000_000, ge=1_000, description="Result size cap of any query (bytes).")
    memory_limit_mb: int = Field(2048, ge=64, description="Address-space limit of each query process.")
    sandbox: Literal["auto", "process", "bwrap"] = Field(
        "auto", description="process: a resource-limited child process; bwrap: also a bubblewrap namespace "
                            "(read-only filesystem, no network); auto: bwrap where it works, else process.")
    sandbox_workers: int = Field(4, ge=1, description="Query processes shared by all envs of this process.")
    format_penalty: float = Field(-1.0, le=0.0, description="Reward of a malformed episode.")
    require_think: bool = Field(True, description="SkyRL-SQL's format rule: <think> first and after every observation.")
    duplicates: Literal["ignore", "count"] = Field(
        "ignore", description="Unordered result comparison as sets (SkyRL-SQL) or as multisets.")

    @field_validator("engine")
    @classmethod
    def _engine_installed(cls, engine: str) -> str:
        if engine == "duckdb" and importlib.util.find_spec("duckdb") is None:
            raise ValueError("engine 'duckdb' needs the duckdb package: pip install duckdb")
        return engine
