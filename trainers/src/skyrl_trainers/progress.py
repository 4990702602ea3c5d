"""Rich progress bar for training: one bar over steps, the current phase, a line per finished step."""

from __future__ import annotations

from typing import Any


class TrainingProgress:
    """``with TrainingProgress(total=10, done=0) as p: p.phase(1, "generate"); p.step_done(1, metrics)``.

    With ``enabled=False`` every method is a no-op (``run.console=false``).
    """

    SHOWN = (("reward/mean", "reward"), ("train/loss", "loss"), ("train/kl", "kl"), ("train/grad_norm", "grad"),
             ("time/step_seconds", "s"))

    def __init__(self, total: int, done: int = 0, enabled: bool = True) -> None:
        self.progress: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=Console(stderr=True))
            self.task = self.progress.add_task("starting", total=total, completed=done)

    def __enter__(self) -> TrainingProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def phase(self, step: int, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=f"step {step}: {name}")

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        if self.progress is None:
            return
        shown = "  ".join(f"{label} {metrics[key]:.4g}" for key, label in self.SHOWN if key in metrics)
        self.progress.console.print(f"step {step}  {shown}")
        self.progress.advance(self.task)
