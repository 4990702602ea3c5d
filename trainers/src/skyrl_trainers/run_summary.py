"""The summary of a training run (the table a run prints last), the same for every ``trainer.mode``: the
sync loop in :mod:`.trainer` and the overlapped ones in :mod:`.overlap` use it; :class:`RunClock` adds
where the run's wall time went."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

SUMMARY_WINDOW = 3  # steps averaged for the reward at the start and at the end of a run


def summarize(history: list[dict[str, float]], last_step: int, seconds: float) -> dict[str, float]:
    """The numbers a user checks first: reward at the start and end, speed, the final training stats.

    ``seconds`` is the step loop's wall time (``time/step_loop_seconds``: the steps and the evaluations
    after them); the whole run's, with its parts, is :meth:`RunClock.summary`'s.

    ``reward/first`` and ``reward/last`` are means over the first and last ``SUMMARY_WINDOW`` steps (one
    step's reward depends on which tasks it drew); ``task_reward/first|last`` likewise for an env that
    reports its unshaped score as ``env/task_reward``.
    """
    summary: dict[str, float] = {"steps": float(last_step), "time/step_loop_seconds": seconds}
    if not history:
        return summary
    for key, name in (("reward/mean", "reward"), ("env/task_reward", "task_reward")):
        values = [h[key] for h in history if key in h]
        if values:
            summary[f"{name}/first"] = sum(values[:SUMMARY_WINDOW]) / len(values[:SUMMARY_WINDOW])
            summary[f"{name}/last"] = sum(values[-SUMMARY_WINDOW:]) / len(values[-SUMMARY_WINDOW:])
    summary["reward/best"] = max(h.get("reward/mean", 0.0) for h in history)
    last = history[-1]
    for key in ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/logprob_gap_mean",
                "throughput/train_tokens_per_second", "rollout/generated_tokens_per_second", "time/step_seconds"):
        if key in last:
            summary[key] = last[key]
    return summary


class RunClock:
    """Where a run's wall time goes, from its start (``fit``) to the end of the export.

    ``time/total_seconds`` is that whole time, the one the user waited; its parts are ``setup`` (tasks,
    model, engine and ranks), ``evaluation`` (held-out, before and during training), ``generation_and_env``
    (the rollouts, env and sandbox steps included: the generator plays them in between engine calls, so
    they are not timed apart), ``training``, ``weight_sync``, ``checkpoint``, ``export`` and ``other``
    (logging, samples, the rest). Off ``sync`` generation overlaps training, so ``generation_and_env`` is
    the time training waited for it.
    """

    PARTS = ("setup", "evaluation", "generation_and_env", "training", "weight_sync", "checkpoint", "export")
    STEP_TIMES = {"generation_and_env": ("time/generate_seconds", "time/wait_seconds"), "training": ("time/train_seconds",),
                  "weight_sync": ("time/sync_seconds",)}
    """Per-step metrics that time each part (the first one a step has counts): sync, then overlapped modes."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(self.PARTS, 0.0)

    def setup_done(self) -> None:
        """Everything so far was setup (call once, when the first evaluation or step starts)."""
        self.seconds["setup"] = time.perf_counter() - self.started

    @contextmanager
    def measure(self, part: str) -> Iterator[None]:
        """Add the time spent inside the ``with`` block to ``part``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - started

    def add_step(self, metrics: dict[str, float]) -> None:
        """Count a finished step's generation, training and weight-sync times."""
        for part, keys in self.STEP_TIMES.items():
            self.seconds[part] += next((metrics[key] for key in keys if key in metrics), 0.0)

    def summary(self) -> dict[str, float]:
        """``time/total_seconds`` and ``time/<part>_seconds`` for every part, ``other`` last."""
        total = time.perf_counter() - self.started
        parts = {f"time/{part}_seconds": seconds for part, seconds in self.seconds.items()}
        return {"time/total_seconds": total, **parts, "time/other_seconds": max(total - sum(self.seconds.values()), 0.0)}
