"""Options of the ``sql`` env (section ``env`` of a run config). Every limit has a safe default."""

from __future__ import annotations

import importlib.util
import math
import warnings
from typing import Literal

from pydantic import Field, field_validator, model_validator
from skyrl_core import EnvConfig
from skyrl_sandbox.options import WorkerBackend, backend_description

GRACE_S = 2.0  # how long after a query's time limit its process is killed (when it cannot stop the query itself)


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
    sandbox: WorkerBackend = Field("auto", description=backend_description(
        "Here it holds the query processes, which see read-only only the database folder, the Python standard "
        "library and the driver (a container backend runs them as a uid of its own: the database folders must be "
        "readable by everyone). 'process' is a deprecated name of subprocess."))
    sandbox_workers: int = Field(4, ge=1, description="Query processes shared by all envs of this process.")
    sandbox_cpu_time_s: int = Field(
        3600, ge=1, description="CPU seconds one query process may use over its life (RLIMIT_CPU, a backstop: each "
                                "query is bounded by its time limit). A process is replaced once its queries have "
                                "run for half of this.")
    format_penalty: float = Field(-1.0, le=0.0, description="Reward of a malformed episode.")
    require_think: bool = Field(True, description="SkyRL-SQL's format rule: <think> first and after every observation.")
    duplicates: Literal["ignore", "count"] = Field(
        "ignore", description="Unordered result comparison as sets (SkyRL-SQL) or as multisets.")

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox_name(cls, value: object) -> object:
        if value == "process":
            warnings.warn("env.sandbox='process' is deprecated; use 'subprocess' (the same opt-in, weaker backend)",
                          FutureWarning, stacklevel=2)
            return "subprocess"
        return value

    @model_validator(mode="after")
    def _cpu_time_covers_queries(self) -> SQLEnvConfig:
        longest = max(self.query_timeout_s, self.reward_timeout_s) + GRACE_S
        if self.sandbox_cpu_time_s < 2 * longest:
            raise ValueError(f"sandbox_cpu_time_s={self.sandbox_cpu_time_s} must be at least {math.ceil(2 * longest)}: "
                             "twice the longest query time limit plus its grace period, so no query of a process "
                             "can reach the CPU limit")
        return self

    @field_validator("engine")
    @classmethod
    def _engine_installed(cls, engine: str) -> str:
        if engine == "duckdb" and importlib.util.find_spec("duckdb") is None:
            raise ValueError("engine 'duckdb' needs the duckdb package: pip install duckdb")
        return engine
