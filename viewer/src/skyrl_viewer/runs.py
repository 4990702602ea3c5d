"""Read run folders as the trainer writes them, tolerating folders that are missing, partial or growing,
and the results folders of ``skyrl eval`` (``eval.json`` beside the same ``config.yaml`` and ``samples.jsonl``).

Nothing here raises on a bad folder: every reader returns what it could read plus ``problems``, short
sentences the page shows instead of a blank chart (no ``metrics.jsonl``, a truncated last line that is
still being written, a malformed line, zero steps). Files are read again on every call, so a page that
polls sees new lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import IO, Any

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.yaml"
EVAL_FILE = "eval.json"  # the results folder of `skyrl eval` (skyrl_core.eval_folder), written last
EVAL_METRICS_FILE = "metrics.json"
PER_TASK_FILE = "per_task.json"
DEFAULT_MAX_LINE_BYTES = 256 << 20
MAX_DEPTH = 100  # deeper lines are skipped: the API and the export walk records recursively

# A string, or what is left of an unclosed one (so that no quote is tried twice: linear on any line).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


@dataclass
class Lines:
    """The JSON objects of a JSONL file and what went wrong while reading it."""

    records: list[dict[str, Any]]
    problems: list[str]


_parsed: dict[Path, tuple[tuple[int, int, int], Lines]] = {}  # path -> (version, lines): unchanged files parse once
_objects: dict[Path, tuple[tuple[int, int, int], dict[str, Any], str | None]] = {}  # the same for JSON files


def read_jsonl(path: Path, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Lines:
    """Every parseable object line of ``path``; the others are skipped and reported as problems.

    Skipped: a line that is not a JSON object, one larger than ``max_line_bytes`` (never held in memory
    whole), one nested deeper than :data:`MAX_DEPTH` (checked before parsing), and a bad last line
    without its newline, which is a write in progress.
    """
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size, max_line_bytes)
        cached = _parsed.get(path)
        if cached and cached[0] == version:
            return Lines(list(cached[1].records), list(cached[1].problems))
        with path.open("rb") as file:
            lines = list(_lines(file, max_line_bytes))
    except FileNotFoundError:
        return Lines([], [f"{path.name} does not exist"])
    except OSError as exc:
        return Lines([], [f"{path.name} cannot be read: {exc.strerror or exc}"])
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        record, problem = _parse(line, number, max_line_bytes)
        if record is not None:
            records.append(record)
        elif problem is not None:
            problems.append(f"{path.name}: {problem}")
    _parsed[path] = (version, Lines(records, problems))
    return Lines(list(records), list(problems))


def _lines(file: IO[bytes], limit: int) -> Iterator[bytes | None]:
    """The lines of ``file`` with their newlines; ``None`` for one longer than ``limit`` bytes, read past in chunks."""
    while line := file.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = file.readline(1 << 20)
        yield None


def _parse(line: bytes | None, number: int, max_line_bytes: int) -> tuple[dict[str, Any] | None, str | None]:
    """Line ``number``'s object, or ``None`` and what to report (``None`` for a blank line)."""
    if line is None:
        return None, f"line {number} is larger than {max_line_bytes / 2**20:g} MB and was skipped"
    text = line.decode("utf-8", errors="replace")
    if not text.strip():
        return None, None
    if _nests_deeper(text, MAX_DEPTH):
        return None, f"line {number} nests deeper than {MAX_DEPTH} levels and was skipped"
    try:
        record = json.loads(text)
    except ValueError:
        if not line.endswith(b"\n"):  # the writer is mid-line
            return None, "the last line is incomplete (still being written?) and was skipped"
        return None, f"line {number} is not valid JSON and was skipped"
    if not isinstance(record, dict):
        return None, f"line {number} is not a JSON object and was skipped"
    return record, None


def _nests_deeper(text: str, limit: int) -> bool:
    """Whether the arrays and objects of a JSON text nest deeper than ``limit``, counted on its brackets outside
    strings (no parsing; stops at the first bracket too deep)."""
    brackets = map(re.Match.group, _BRACKET.finditer(_STRING.sub("", text)))
    return any(level > limit for level in accumulate(map(_NESTING.__getitem__, brackets)))


class Run:
    """One run folder given on the command line."""

    def __init__(self, path: str | Path, name: str | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.path = Path(path).expanduser()
        self.name = name or self.path.resolve().name or str(self.path)
        self.max_line_bytes = max_line_bytes

    def metrics(self) -> Lines:
        """Rows of ``metrics.jsonl`` that carry a numeric ``step``, in step order (none for an evaluation,
        which trains no steps: its problems are those of its result files)."""
        evaluation = self.evaluation()
        if evaluation is not None and not (self.path / METRICS_FILE).is_file():
            return Lines([], list(evaluation["problems"]))
        missing = self._missing(METRICS_FILE, "the run has not logged a step yet, or this is not a run folder")
        if missing:
            return missing
        lines = read_jsonl(self.path / METRICS_FILE, self.max_line_bytes)
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
        lines = read_jsonl(self.path / SAMPLES_FILE, self.max_line_bytes)
        for index, record in enumerate(lines.records):
            record.setdefault("id", f"line{index + 1}")
        return lines

    def is_eval(self) -> bool:
        """Whether this is a results folder of ``skyrl eval`` (it has ``eval.json``) rather than a run."""
        return (self.path / EVAL_FILE).is_file()

    def evaluation(self) -> dict[str, Any] | None:
        """What ``skyrl eval`` wrote (``eval.json``, ``metrics.json``, ``per_task.json``), each ``{}`` when
        unreadable, plus ``problems``; ``None`` for a folder that is not an evaluation."""
        if not self.is_eval():
            return None
        found: dict[str, Any] = {"problems": []}
        for key, name in (("info", EVAL_FILE), ("metrics", EVAL_METRICS_FILE), ("per_task", PER_TASK_FILE)):
            found[key], problem = self._json_object(name)
            if problem:
                found["problems"].append(problem)
        return found

    def _json_object(self, name: str) -> tuple[dict[str, Any], str | None]:
        """The JSON object in file ``name`` and ``None``, or ``{}`` and what is wrong with the file."""
        path = self.path / name
        try:
            stat = path.stat()
            version = (stat.st_mtime_ns, stat.st_size, self.max_line_bytes)
            cached = _objects.get(path)
            if cached and cached[0] == version:
                return dict(cached[1]), cached[2]
            if stat.st_size > self.max_line_bytes:
                return {}, f"{name} is larger than {self.max_line_bytes / 2**20:g} MB and was skipped"
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return {}, f"no {name} in {self.path}: the evaluation did not finish writing its results"
        except OSError as exc:
            return {}, f"{name} cannot be read: {exc.strerror or exc}"
        value: Any = {}
        problem = None
        if _nests_deeper(text, MAX_DEPTH):
            problem = f"{name} nests deeper than {MAX_DEPTH} levels and was skipped"
        else:
            try:
                value = json.loads(text)
            except ValueError:
                problem = f"{name} is not valid JSON"
        if problem is None and not isinstance(value, dict):
            value, problem = {}, f"{name} is not a JSON object"
        _objects[path] = (version, value if isinstance(value, dict) else {}, problem)
        return dict(_objects[path][1]), problem

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
        """The policy (``trainer.model``), else the evaluated model (``engine.model``, an evaluation's)."""
        config = self.config()
        for section in ("trainer", "engine"):
            options = config.get(section)
            model = options.get("model") if isinstance(options, dict) else None
            if isinstance(model, str):
                return model
        return None
