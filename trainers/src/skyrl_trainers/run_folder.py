"""The run folder: resolved config, metrics, sample trajectories, checkpoints and the final export.

    RUN_DIR/config.yaml                      the resolved config of the latest (re)start
    RUN_DIR/metrics.jsonl                    one line per step (skyrl_core.metrics.MetricsLogger)
    RUN_DIR/samples.jsonl                    a few trajectories per step (metrics.train_step = step)
    RUN_DIR/checkpoints/step_000004/         shards/ (model + optimizer), worker_rank*.pt, trainer_state.pt
    RUN_DIR/checkpoints/latest               name of the newest complete checkpoint, written last
    RUN_DIR/export/                          Hugging Face folder of the final policy (LoRA merged in)
    RUN_DIR/export/lora_adapter/             with trainer.lora: the adapter alone (peft save_pretrained)

With LoRA a checkpoint's ``shards/`` hold only the adapters and their optimizer state.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from skyrl_core.factory import ConfigError

LORA_ADAPTER_FOLDER = "lora_adapter"  # inside the export folder


class RunFolderError(ConfigError):
    """``run.output_dir`` or ``run.resume`` points at the wrong folder (no checkpoint, or another run)."""


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"
        self.samples = self.path / "samples.jsonl"
        self.export = self.path / "export"
        self.export_adapter = self.export / LORA_ADAPTER_FOLDER

    def create(self, config: dict[str, Any], resuming: bool = False) -> None:
        """Make the folder and write the config; a fresh run refuses a folder that holds another run."""
        if not resuming and (self.metrics.exists() or self.checkpoints.exists()):
            raise RunFolderError(f"run folder {str(self.path)!r} already holds a run; continue it with "
                                  f"run.resume={self.path} or choose another run.output_dir")
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def saved_config(self) -> str | None:
        """The text of ``config.yaml`` (``None`` where there is none yet)."""
        path = self.path / "config.yaml"
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def undo_create(self, fresh: bool, previous_config: str | None) -> None:
        """Undo :meth:`create` for a run that failed before its first step: remove the folder where ``fresh``
        (this run made it), else put back the ``config.yaml`` it held (a failed resume does not change it)."""
        if fresh:
            shutil.rmtree(self.path, ignore_errors=True)
        elif previous_config is not None:
            (self.path / "config.yaml").write_text(previous_config, encoding="utf-8")

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def new_checkpoint(self, step: int) -> Path:
        """An empty folder for the checkpoint of ``step`` (an earlier partial attempt is discarded)."""
        folder = self.checkpoint_dir(step)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def commit_checkpoint(self, step: int) -> None:
        """Mark ``step`` as the newest complete checkpoint (atomic rename of the ``latest`` file)."""
        marker = self.checkpoints / "latest"
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(self.checkpoint_dir(step).name, encoding="utf-8")
        os.replace(tmp, marker)

    def latest_checkpoint(self) -> Path:
        marker = self.checkpoints / "latest"
        if not marker.is_file():
            raise RunFolderError(f"run.resume={str(self.path)!r}: no complete checkpoint in {self.checkpoints} "
                                  "(the run saved none yet, or this is not a run folder)")
        folder = self.checkpoints / marker.read_text(encoding="utf-8").strip()
        if not (folder / "trainer_state.pt").is_file():
            raise RunFolderError(f"checkpoint {folder} named by {marker} is incomplete")
        return folder

    def forget_after(self, step: int) -> None:
        """Drop metrics and samples logged after ``step`` (a run that went on past its last checkpoint)."""
        for path, step_of in ((self.metrics, lambda r: r.get("step")),
                              (self.samples, lambda r: r.get("metrics", {}).get("train_step"))):
            if not path.is_file():
                continue
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and (step_of(json.loads(line)) or 0) <= step]
            path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

