"""Read run folders as the trainer writes them, tolerating folders that are missing, partial or growing.

Nothing here raises on a bad folder: every reader returns what it could read plus ``problems``, short
sentences the page shows instead of a blank chart (no ``metrics.jsonl``, a truncated last line that is
still being written, zero steps). Files are read again on every call, so a page that polls sees new lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.yaml"


@dataclass
class Lines:
    """The JSON objects of a JSONL file and what went wrong while reading it."""

    records: list[dict[str, Any]]
    problems: list[str]


_parsed: dict[Path, tuple[tuple[int, int], Lines]] = {}  # path -> ((mtime, size), lines): unchanged files parse once


def read_jsonl(path: Path) -> Lines:
    """Every parseable object line of ``path``; a bad last line without its newline is a write in progress."""
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        cached = _parsed.get(path)
        if cached and cached[0] == version:
            return Lines(list(cached[1].records), list(cached[1].problems))
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return Lines([], [f"{path.name} does not exist"])
    except OSError as exc:
        return Lines([], [f"{path.name} cannot be read: {exc.strerror or exc}"])
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):  # no newline after it: the writer is mid-line
                problems.append(f"{path.name}: the last line is incomplete (still being written?) and was skipped")
            else:
                problems.append(f"{path.name}: line {number} is not valid JSON and was skipped")
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            problems.append(f"{path.name}: line {number} is not a JSON object and was skipped")
    _parsed[path] = (version, Lines(records, problems))
    return Lines(list(records), list(problems))


class Run:
    """One run folder given on the command line."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path).expanduser()
        self.name = name or self.path.resolve().name or str(self.path)

    def metrics(self) -> Lines:
        """Rows of ``metrics.jsonl`` that carry a numeric ``step``, in step order."""
        missing = self._missing(METRICS_FILE, "the run has not logged a step yet, or this is not a run folder")
        if missing:
            return missing
        lines = read_jsonl(self.path / METRICS_FILE)
        rows = [r for r in lines.records if isinstance(r.get("step"), (int, float))]
        if len(rows) < len(lines.records):
            lines.problems.append(f"{METRICS_FILE}: {len(lines.records) - len(rows)} line(s) without a step skipped")
        if not rows:
            lines.problems.append(f"{METRICS_FILE} holds no steps yet: the run has not finished its first step")
        return Lines(sorted(rows, key=lambda r: r["step"]), lines.problems)

    def samples(self) -> Lines:
        """Records of ``samples.jsonl`` (trajectories as dicts), each given an ``id`` if it had none."""
        missing = self._missing(SAMPLES_FILE, "the trainer writes sample trajectories there after each step")
        if missing:
            return missing
        lines = read_jsonl(self.path / SAMPLES_FILE)
        for index, record in enumerate(lines.records):
            record.setdefault("id", f"line{index + 1}")
        return lines

    def _missing(self, name: str, why: str) -> Lines | None:
        """An empty result with the reason when the folder or its file ``name`` is not there."""
        if not self.path.exists():
            return Lines([], [f"{self.path} does not exist"])
        if not self.path.is_dir():
            return Lines([], [f"{self.path} is not a folder"])
        if not (self.path / name).is_file():
            return Lines([], [f"no {name} in {self.path}: {why}"])
        return None

    def config(self) -> dict[str, Any]:
        """The resolved config (``config.yaml``), or ``{}`` when it is missing or unreadable."""
        import yaml

        try:
            data = yaml.safe_load((self.path / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return {}
        return data if isinstance(data, dict) else {}

    def model_name(self) -> str | None:
        trainer = self.config().get("trainer")
        model = trainer.get("model") if isinstance(trainer, dict) else None
        return model if isinstance(model, str) else None
