"""Metrics logging: a JSONL file in the run folder always, the console and W&B when asked."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Writes ``{"step": n, "time": t, **metrics}`` lines to ``<run_dir>/metrics.jsonl``.

    ``console=True`` prints a compact table per step with rich; ``wandb_project`` also logs to
    Weights & Biases (offline mode when no ``WANDB_API_KEY`` is set, unless ``wandb_mode`` says).
    """

    def __init__(self, run_dir: str | Path, *, console: bool = True, wandb_project: str | None = None,
                 wandb_mode: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._console = None
        if console:
            from rich.console import Console

            self._console = Console(stderr=True)
        self._wandb = None
        if wandb_project:
            self._wandb = _start_wandb(wandb_project, wandb_mode, self.run_dir, config)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        clean = {k: _finite(v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._console is not None:
            self._console.print(format_metrics_table(f"step {step}", clean))

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_metrics_table(title: str, metrics: Mapping[str, Any]) -> Any:
    """A two-column rich table of metric names and values."""
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None, pad_edge=False)
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    return table


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _start_wandb(project: str, mode: str | None, run_dir: Path, config: Mapping[str, Any] | None) -> Any:
    try:
        import wandb
    except ImportError:
        raise RuntimeError("run.wandb_project is set but wandb is not installed: pip install 'skyrl-core[wandb]'") from None
    mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    return wandb.init(project=project, mode=mode, dir=str(run_dir), config=dict(config or {}))
