"""Held-out evaluation during training (``trainer.eval_*``): the same tasks with the same seeds before
the first step, every ``eval_every`` steps and after the last step, so the numbers compare across steps.

An evaluation plays one episode per task with the run's generator (its config with one sample per task
and, with ``eval_temperature``, that temperature), seeded with ``request_seed(run.seed, "eval")`` every
time, on the engine's current weights: after step N's weight sync, i.e. the policy trained for N steps
(step 0: the initial policy). It draws nothing from the task stream or the RNG and never trains, so a
run trains as it does with evaluation off (``trainer.eval_samples=0``). A run on ``trainer.train_files``
evaluates only on ``eval_files`` or an ``eval_split`` it names: the env's built-in split is not held out
from the user's tasks. Its numbers are ``eval/*``
(:func:`skyrl_core.held_out.held_out_metrics`); the step-0 evaluation is a row of its own in
``metrics.jsonl``, later ones join their step's row.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from skyrl_core.config import ResolvedConfig
from skyrl_core.data import DataError
from skyrl_core.factory import ConfigError, generator_class
from skyrl_core.generator import request_seed
from skyrl_core.held_out import eval_summary, held_out_metrics, held_out_split
from skyrl_core.plugins import get_registry
from skyrl_core.protocols import Generator

from skyrl_trainers.data import load_training_tasks
from skyrl_trainers.seeding import accepts_seed

log = logging.getLogger(__name__)


def eval_split(config: ResolvedConfig) -> str:
    """``trainer.eval_split``, else the split the env declares held out for ``trainer.data_split``."""
    cfg = config.trainer
    return cfg.eval_split or held_out_split(get_registry().get("env", config.env_id), cfg.data_split)


def spread(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` rows spread evenly over ``rows`` in order (all of them when there are no more)."""
    if count >= len(rows):
        return list(rows)
    return [rows[index * len(rows) // count] for index in range(count)]


class HeldOutEval:
    """The evaluations of one run: its tasks, when they are due, and the records for the summary."""

    def __init__(self, config: ResolvedConfig, env_cls: Any) -> None:
        cfg = config.trainer
        self.config = config
        self.every, self.last_step = cfg.eval_every, cfg.steps
        self.reward_range = env_cls.reward_range_for(config.env)
        self.split = eval_split(config)
        self.source = ", ".join(cfg.eval_files) if cfg.eval_files else f"split {self.split!r}"
        self.tasks: list[dict[str, Any]] = []
        if cfg.eval_samples and cfg.train_files and not cfg.eval_files and cfg.eval_split is None:
            log.warning("held-out evaluation is off: the run trains on trainer.train_files, from which the env's "
                        "built-in split %r is not held out; give held-out tasks in trainer.eval_files (or a built-in "
                        "split in trainer.eval_split)", self.split)
        elif cfg.eval_samples:
            try:
                rows = load_training_tasks(env_cls, config.env, cfg.eval_files, self.split)
            except DataError as exc:
                where = "trainer.eval_files" if cfg.eval_files else f"trainer.eval_split={self.split!r}"
                raise DataError(f"held-out evaluation ({where}): {exc}. Choose its tasks with trainer.eval_split or "
                                "trainer.eval_files, or turn it off with trainer.eval_samples=0") from None
            except ValueError as exc:  # e.g. an env's own error for a split it does not have
                raise DataError(f"held-out evaluation: env {config.env_id!r} cannot load split {self.split!r} "
                                f"({exc}); set trainer.eval_split to one of its splits (the env declares its "
                                "held-out splits in EnvSpec.eval_splits), or turn evaluation off with "
                                "trainer.eval_samples=0") from None
            self.tasks = spread(rows, cfg.eval_samples)
        self.generator_config = self._generator_config() if self.tasks else None
        self.generator: Generator | None = None
        self.seed: dict[str, int] = {}
        self.records: list[tuple[int, dict[str, float]]] = []

    @property
    def about(self) -> str:
        """What is evaluated, for the console: ``8 tasks of split 'starter_test'``."""
        return f"{len(self.tasks)} task(s) of {self.source}"

    def _generator_config(self) -> Any:
        """The run's generator options with one sample per task and ``eval_temperature``, if set."""
        config, cfg = self.config, self.config.trainer
        options = config.generator
        fields = type(options).model_fields if options is not None else {}
        update: dict[str, Any] = {"n_samples_per_prompt": 1} if "n_samples_per_prompt" in fields else {}
        if cfg.eval_temperature is not None:
            if "temperature" not in fields:
                raise ConfigError(f"trainer.eval_temperature={cfg.eval_temperature:g} is set, but generator "
                                  f"{config.generator_id!r} has no temperature option; unset it")
            update["temperature"] = cfg.eval_temperature
        return options.model_copy(update=update) if options is not None else None

    def attach(self, engine: Any, tokenizer: Any) -> None:
        """Build the evaluation's generator on the run's engine (nothing when evaluation is off)."""
        if not self.tasks:
            return
        config = self.config
        self.generator = generator_class(config.generator_id)(
            self.generator_config, engine=engine, tokenizer=tokenizer, env_id=config.env_id, env_config=config.env)
        self.seed = {"seed": request_seed(config.run.seed, "eval")} if accepts_seed(self.generator) else {}

    def close(self) -> None:
        """Release what the evaluation's generator holds (its env workers on Ray, where placed there)."""
        if self.generator is not None:
            self.generator.close()

    def load_history(self, metrics_path: str | Path) -> None:
        """Earlier evaluations of a resumed run (its ``metrics.jsonl``), so the summary starts at step 0."""
        path = Path(metrics_path)
        if not path.is_file():
            return
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else {}
            if "eval/reward_mean" in record:
                self.records.append((int(record["step"]), {k: v for k, v in record.items() if k.startswith("eval/")}))

    def due(self, step: int) -> bool:
        """Evaluate after ``step`` (0: before training)? At 0, every ``eval_every`` steps and at the end."""
        if not self.tasks:
            return False
        return step in (0, self.last_step) or bool(self.every and step % self.every == 0)

    async def run(self, step: int) -> dict[str, float]:
        """Play the evaluation on the engine's current weights; its ``eval/*`` metrics."""
        started = time.perf_counter()
        assert self.generator is not None  # built by attach(), before any evaluation is due
        batch = await self.generator.generate(self.tasks, **self.seed)
        metrics = held_out_metrics(batch, self.reward_range)
        metrics["eval/seconds"] = time.perf_counter() - started
        self.records.append((step, metrics))
        return metrics

    def summary(self) -> dict[str, float]:
        """``eval/reward_mean_first|last``, ``eval/pass_rate_first|last``, ``eval/step_first|last``."""
        return eval_summary(self.records)
