"""``skyrl check ENV --dataset PATH``: what of a dataset runs here, task by task.

Every task's gold actions are played (:func:`skyrl_core.oracle.play_gold`) and one table row per
task says its oracle reward, how the episode ended and what is wrong. An env adds columns of its own
through ``info["report"]`` (a flat ``{column: text}`` mapping on any turn, e.g. a terminal env's
image source and build), so a user sees at once which tasks build, start and score.

``PATH`` goes to the env's :attr:`~skyrl_core.env.TextEnv.dataset_option` config field when the env
declares one (a folder of task folders, a Parquet file, ...); otherwise it must be a JSONL file of
task rows.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_core.data import read_jsonl_tasks
from skyrl_core.env import TextEnv
from skyrl_core.factory import ConfigError, component_config
from skyrl_core.oracle import OracleResult, play_gold


@dataclass
class DatasetReport:
    """The oracle episode of every task of a dataset, and the warnings its loading raised."""

    env: str
    dataset: str
    reward_range: tuple[float, float]
    results: list[OracleResult]
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[OracleResult]:
        return [r for r in self.results if r.problem(self.reward_range) is not None]

    @property
    def columns(self) -> list[str]:
        """The env's own columns, in the order they first appear."""
        return list(dict.fromkeys(key for r in self.results for key in r.report))

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per task: name, the env's columns, oracle reward, end and problem."""
        columns = self.columns
        return [{"task": r.task_name, **{c: r.report.get(c, "") for c in columns}, "oracle reward": r.reward,
                 "end": r.end, "problem": r.problem(self.reward_range) or ""} for r in self.results]

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "dataset": self.dataset, "tasks": len(self.results), "failed": len(self.failed),
                "warnings": self.warnings, "rows": self.rows()}


def dataset_rows(env_cls: type[TextEnv], env_id: str, options: Mapping[str, Any], dataset: Path,
                 registry: Any) -> tuple[Any, list[dict[str, Any]], list[str]]:
    """(the env config, the dataset's rows, the warnings raised while reading them)."""
    option = env_cls.dataset_option
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if option is not None:
            config = component_config("env", env_id, {**options, option: str(dataset)}, registry)
            rows = list(env_cls.load_dataset("train", config))
        elif dataset.suffix == ".jsonl":
            config = component_config("env", env_id, dict(options), registry)
            rows = read_jsonl_tasks(dataset)
        else:
            raise ConfigError(f"env {env_id!r} reads no dataset path (it declares no dataset_option); "
                              f"--dataset takes a JSONL file of task rows for it, got {dataset}")
    messages = list(dict.fromkeys(str(w.message) for w in caught))
    return config, rows, messages


def dataset_report(env_cls: type[TextEnv], env_id: str, options: Mapping[str, Any], dataset: Path, registry: Any,
                   *, concurrency: int = 2, seed: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> DatasetReport:
    """Play every task's gold actions; ``progress(done, total)`` after each episode."""
    config, rows, messages = dataset_rows(env_cls, env_id, options, dataset, registry)
    if not rows:
        raise ConfigError(f"{dataset}: no tasks in this dataset for env {env_id!r}")
    done = 0

    def advance(_result: OracleResult) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, len(rows))

    results = asyncio.run(play_gold(env_cls, config, rows, concurrency=concurrency, seed=seed, on_result=advance))
    return DatasetReport(env_id, str(dataset), env_cls.reward_range_for(config), results, messages)
