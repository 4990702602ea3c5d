"""The results folder of ``skyrl eval``, in the file names and formats of a training run folder where
the two hold the same thing, so that ``skyrl view`` and scripts read both alike::

    DIR/eval.json      what was evaluated: env, model, engine, generator, split or task file, tasks,
                       samples per task, the passing rule, when and how long, package versions
    DIR/config.yaml    the resolved config (as a run folder's config.yaml; no trainer section)
    DIR/samples.jsonl  every trajectory, children after their roots (as a run folder's samples.jsonl,
                       without the training fields metrics.train_step and metrics.advantage)
    DIR/metrics.json   the aggregate metrics: the summary table (reward/*, env/*, eval/pass@k, ...)
    DIR/per_task.json  the per-task table: n, passed, pass@k for each k, mean@k, errors, rewards

``eval.json`` is written last: a folder that has it is complete.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from skyrl_core.factory import ConfigError
from skyrl_core.trajectory import Trajectory, write_jsonl

EVAL_FILE = "eval.json"
CONFIG_FILE = "config.yaml"
SAMPLES_FILE = "samples.jsonl"
METRICS_FILE = "metrics.json"
PER_TASK_FILE = "per_task.json"
EVALS_DIR = "evals"
ENGINE_PACKAGES = ("torch", "transformers", "vllm")  # what the sampled tokens depend on beside our own packages


def default_eval_dir(env_id: str, model: str, root: str | Path = EVALS_DIR) -> Path:
    """``evals/<env>-<model>-<timestamp>``; ``-2``, ``-3`` ... when an evaluation started the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{env_id}-{safe_name(model)}-{stamp}"
    folder, number = base, 1
    while folder.exists():
        number += 1
        folder = base.with_name(f"{base.name}-{number}")
    return folder


def safe_name(model: str) -> str:
    """A model name or path as one folder name: ``org/name`` -> ``org_name``, a path -> its last part."""
    text = model.rstrip("/\\")
    if Path(text).expanduser().exists():
        text = Path(text).expanduser().resolve().name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "model"


def check_eval_dir(folder: Path) -> None:
    """Refuse a folder that already holds results (an evaluation or a run): nothing is overwritten."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {str(folder)!r} is a file, not a folder")
    for name in (EVAL_FILE, SAMPLES_FILE, "metrics.jsonl"):
        if (folder / name).exists():
            raise ConfigError(f"--out {str(folder)!r} already holds results ({name}); choose another folder")


def package_versions(plugin_manager: Any) -> dict[str, str]:
    """Python, skyrl-core, every installed skyrl distribution and the engine libraries that are installed."""
    from skyrl_core.versions import installed_versions

    versions = installed_versions(plugin_manager)
    for name in ENGINE_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def write_eval_folder(folder: Path, *, info: Mapping[str, Any], config: Mapping[str, Any],
                      trajectories: Sequence[Trajectory], metrics: Mapping[str, float],
                      per_task: Mapping[str, Any]) -> Path:
    """Write the results folder (``eval.json`` last) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / SAMPLES_FILE, trajectories)
    (folder / CONFIG_FILE).write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    _write_json(folder / METRICS_FILE, dict(metrics))
    _write_json(folder / PER_TASK_FILE, dict(per_task))
    _write_json(folder / EVAL_FILE, dict(info))
    return folder


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(_finite(value), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
