"""Rich progress bars for training: steps (with the current phase), episodes of the current rollout
(shown only while episodes are played), and one line per finished step.
"""

from __future__ import annotations

from typing import Any

from skyrl_core.hookspecs import hookimpl
from skyrl_core.plugins import get_plugin_manager


class TrainingProgress:
    """``with TrainingProgress(total=10, done=0) as p: p.rollouts(1, 8); p.phase(1, "train"); p.step_done(1, m)``.

    While active it observes ``on_rollout_end`` to advance the episode bar. With ``enabled=False``
    every method is a no-op (``run.console=false``).
    """

    SHOWN = (("reward/mean", "reward"), ("train/loss", "loss"), ("train/kl", "kl"), ("train/grad_norm", "grad"),
             ("time/step_seconds", "s"))

    def __init__(self, total: int, done: int = 0, enabled: bool = True) -> None:
        self.progress: Any = None
        self.pending: str | None = None  # an evaluation's line, printed after its step's
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("[bold]{task.fields[label]:>8}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True))
            self.steps = self.progress.add_task("starting", total=total, completed=done, label="train")
            self.episodes = self.progress.add_task("", total=None, label="episodes", visible=False)

    def __enter__(self) -> TrainingProgress:
        if self.progress is not None:
            self.progress.start()
            get_plugin_manager().register(self)
        return self

    @property
    def enabled(self) -> bool:
        return self.progress is not None

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            get_plugin_manager().unregister(self)
            self._hide_episodes()  # what stays on screen is the steps bar alone
            if next(task for task in self.progress.tasks if task.id == self.steps).finished:
                self.progress.update(self.steps, description="done")
            self.progress.stop()

    def _hide_episodes(self) -> None:
        self.progress.update(self.episodes, visible=False)

    @hookimpl
    def on_rollout_end(self, trajectory: Any) -> None:
        if self.progress is not None and trajectory.parent_id is None:
            self.progress.advance(self.episodes)

    def rollouts(self, step: int, episodes: int) -> None:
        """Generation of ``episodes`` root episodes for ``step`` starts."""
        if self.progress is not None:
            self.progress.reset(self.episodes, total=episodes, visible=True)
            self.phase(step, "generate")

    def evaluating(self, step: int, episodes: int) -> None:
        """The held-out evaluation of the weights after ``step`` (0: before training) starts; the bar says
        so, since on a slow machine the one before the first step can take a while."""
        if self.progress is not None:
            self.progress.reset(self.episodes, total=episodes, visible=True)
            what = "evaluating before the first step" if step == 0 else f"step {step}: evaluating"
            self.progress.update(self.steps, description=f"{what} ({episodes} task(s))")

    def evaluated(self, step: int, metrics: dict[str, float], about: str) -> None:
        """One line for a finished evaluation, ``eval after step 3  reward 0.25  pass rate 0.125  (...)``,
        printed under its step's line (which comes once the step is logged)."""
        if self.progress is None:
            return
        self._hide_episodes()
        when = "before training" if step == 0 else f"after step {step}"
        self.pending = (f"eval {when}  reward {metrics.get('eval/reward_mean', 0.0):.4g}  "
                        f"pass rate {metrics.get('eval/pass_rate', 0.0):.4g}  ({about})")
        if step == 0:
            self._line(self.pending)
            self.pending = None

    def phase(self, step: int, name: str) -> None:
        """``step`` enters phase ``name``; the episodes bar shows only while generating."""
        if self.progress is not None:
            if name != "generate":
                self._hide_episodes()
            self.progress.update(self.steps, description=f"step {step}: {name}")

    def step_done(self, step: int, metrics: dict[str, float], note: str | None = None) -> None:
        """The step's line, then ``note`` (e.g. why it had no learning signal) and a pending evaluation's."""
        if self.progress is None:
            return
        shown = "  ".join(f"{label} {metrics[key]:.4g}" for key, label in self.SHOWN if key in metrics)
        self._line(f"step {step}  {shown}")
        if note:
            self._line(note)
        if self.pending is not None:
            self._line(self.pending)
            self.pending = None
        self.progress.advance(self.steps)

    def _line(self, text: str) -> None:
        """``text`` as it is, on one line: the terminal may wrap it, a log file keeps it whole."""
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
