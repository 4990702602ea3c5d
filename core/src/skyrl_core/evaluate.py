"""``skyrl eval``: play a model on an env's tasks, show what it did and how it scored, keep the results.

The episodes are played as ``skyrl rollout`` plays them (:mod:`skyrl_core.rollouts`) with the defaults
of a held-out evaluation (:mod:`skyrl_core.held_out`): the env's ``run_defaults`` as the lowest config
layer, as ``skyrl run`` has them (without the GRPO group size), and the env's held-out split, so an env
is evaluated with the options and on the tasks a run of it evaluates on. Then come the tables
(:mod:`skyrl_core.eval_report`), the scores (:mod:`skyrl_core.eval_scores`) and the results folder
(:mod:`skyrl_core.eval_folder`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_core.config import ResolvedConfig
from skyrl_core.eval_folder import check_eval_dir, default_eval_dir, package_versions, write_eval_folder
from skyrl_core.eval_scores import episodes_of, eval_metrics, pass_ks, score_tasks, task_rows
from skyrl_core.held_out import default_split, rollout_defaults
from skyrl_core.oracle import task_name
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.rollouts import Rollout, play_rollout, prepare_rollout
from skyrl_core.trajectory import Trajectory


@dataclass
class Evaluation:
    """A resolved evaluation, ready to run: its rollout, where its tasks come from, its folder and rule."""

    rollout: Rollout
    split: str | None
    tasks_file: Path | None
    folder: Path
    pass_threshold: float
    split_why: str = ""
    """Why this split: ``--split``, or the env's held-out split for its training split (empty with a task file)."""
    at_ceilings: bool = True
    """Whether an episode that reaches its task's own ceiling passes (the default threshold; not a --pass-threshold)."""

    @property
    def model(self) -> str:
        return model_name(self.rollout.cfg)

    @property
    def source(self) -> str:
        return f"file {self.tasks_file}" if self.tasks_file else f"split {self.split!r}"


@dataclass
class EvalResult:
    """What an evaluation produced (all of it is in its folder too)."""

    folder: Path
    episodes: list[Trajectory]
    metrics: dict[str, float]
    per_task: list[dict[str, Any]] = field(default_factory=list)

    @property
    def all_failed(self) -> bool:
        return bool(self.episodes) and all(t.error is not None for t in self.episodes)


def model_name(cfg: ResolvedConfig) -> str:
    """The engine's model (``engine.model``), else the engine id (a served model chosen by the server)."""
    return str(getattr(cfg.engine, "model", None) or cfg.engine_id)


def plan_evaluation(layers: Sequence[Mapping[str, Any]], *, split: str | None, tasks: Path | None, n_tasks: int,
                    samples: int | None, out: Path | None, pass_threshold: float | None) -> Evaluation:
    """Resolve the config (the env's rollout defaults under ``layers``), the rows, engine and generator,
    and the results folder.

    Raises what a rollout raises for a bad config, id, task file or engine, and ``ConfigError`` when there
    is no task or ``out`` already holds results (checked before any model loads).
    """
    from skyrl_core.factory import ConfigError

    registry = get_plugin_manager().registry
    if out is not None:
        check_eval_dir(out)
    split_why = "--split" if split else ""
    if split is None and tasks is None:
        split, split_why = default_split(layers, registry)
    rollout = prepare_rollout([rollout_defaults(layers, registry), *layers], split=split or "test", tasks=tasks,
                              n_tasks=n_tasks, samples=samples)
    source = f"file {tasks}" if tasks else f"split {split!r}"
    if not rollout.rows:
        raise ConfigError(f"no tasks to evaluate for env {rollout.cfg.env_id!r}: {source} is empty")
    threshold = rollout.env_cls.reward_range_for(rollout.cfg.env)[1] if pass_threshold is None else pass_threshold
    folder = out or default_eval_dir(rollout.cfg.env_id, model_name(rollout.cfg))
    return Evaluation(rollout, None if tasks else split, tasks, folder, threshold, split_why,
                      at_ceilings=pass_threshold is None)


def run_evaluation(evaluation: Evaluation, *, show: int, console: Any) -> EvalResult:
    """Play the episodes, print the per-sample, per-task and summary tables on ``console``, write the folder."""
    from skyrl_core.eval_report import sample_table, task_table
    from skyrl_core.metrics import format_metrics_table

    rollout, threshold, samples = evaluation.rollout, evaluation.pass_threshold, evaluation.rollout.samples
    started, clock = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    batch = play_rollout(rollout, stderr=True)
    seconds = time.perf_counter() - clock
    episodes = episodes_of(batch.trajectories)
    ks = pass_ks(samples)
    scores = score_tasks(rollout.rows, episodes, threshold, samples, ceilings=evaluation.at_ceilings)
    metrics = {**eval_metrics(scores, ks, samples), **batch.metrics}
    per_task = task_rows(scores, ks, samples)
    if show:
        names = {str(row.get("id", index)): task_name(row, index) for index, row in enumerate(rollout.rows)}
        console.print(sample_table(episodes, names, show, len(episodes)))
    if samples > 1:
        console.print(task_table(per_task, ks, samples, threshold))
    console.print(format_metrics_table("eval summary", metrics))
    cfg = rollout.cfg
    info = {"env": cfg.env_id, "model": evaluation.model, "engine": cfg.engine_id, "generator": cfg.generator_id,
            "split": evaluation.split, "split_why": evaluation.split_why,
            "tasks_file": str(evaluation.tasks_file) if evaluation.tasks_file else None, "tasks": len(rollout.rows),
            "samples_per_task": samples, "episodes": len(episodes), "pass_threshold": threshold,
            "reward_range": list(rollout.env_cls.reward_range_for(cfg.env)), "pass_ks": ks, "started": started,
            "seconds": round(seconds, 3), "versions": package_versions(get_plugin_manager())}
    table = {"pass_threshold": threshold, "pass_ks": ks, "samples_per_task": samples,
             "columns": ["task", "n", "passed", *(f"pass@{k}" for k in ks), f"mean@{samples}", "errors"],
             "tasks": per_task}
    write_eval_folder(evaluation.folder, info=info, config=cfg.to_dict(), trajectories=batch.trajectories,
                      metrics=metrics, per_task=table)
    return EvalResult(evaluation.folder, episodes, metrics, per_task)
