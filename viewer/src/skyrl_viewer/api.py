"""The JSON API the page reads, as plain functions of a path: the server answers with them on each
request (so the page sees a run as it grows) and ``--export`` stores their answers in the HTML file.

    /api/runs                        the runs: name, path, model, env, steps, problems
    /api/runs/<i>/metrics?from=N     metrics rows (from row N on), total row count, problems
    /api/runs/<i>/samples            one summary per stored trajectory (tree links, reward, stop)
    /api/runs/<i>/samples/<id>       one trajectory in full, plus the text of its tokens
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from skyrl_viewer.runs import Run
from skyrl_viewer.tokens import token_texts

PREVIEW_CHARS = 160


class NotFound(Exception):
    """A path the API does not know, or a run or sample that is not there."""


def answer(runs: Sequence[Run], url: str) -> dict[str, Any]:
    """The JSON object for ``url`` (path and query); raises :class:`NotFound`."""
    parts = urlsplit(url)
    path = [unquote(p) for p in parts.path.strip("/").split("/")]
    query = parse_qs(parts.query)
    if path[:2] != ["api", "runs"]:
        raise NotFound(f"no API at {parts.path}")
    if len(path) == 2:
        return {"runs": [run_summary(i, run) for i, run in enumerate(runs)]}
    run = _run(runs, path[2])
    if path[3:] == ["metrics"]:
        start = max(_int(query.get("from", ["0"])[0], 0), 0)
        lines = run.metrics()
        return {"rows": lines.records[start:], "total": len(lines.records), "problems": lines.problems}
    if path[3:] == ["samples"]:
        lines = run.samples()
        return {"samples": [sample_summary(r) for r in lines.records], "problems": lines.problems}
    if len(path) == 5 and path[3] == "samples":
        return {"sample": sample_detail(run, path[4])}
    raise NotFound(f"no API at {parts.path}")


def to_json(value: Any) -> str:
    """JSON text a browser parses: NaN and infinities (``metrics.jsonl`` may hold them) become null."""
    return json.dumps(_finite(value), allow_nan=False, ensure_ascii=False, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def run_summary(index: int, run: Run) -> dict[str, Any]:
    config = run.config()
    env = config.get("env")
    metrics = run.metrics()
    return {"index": index, "name": run.name, "path": str(run.path), "model": run.model_name(),
            "env": env.get("id") if isinstance(env, dict) else None,
            "steps": len(metrics.records), "problems": metrics.problems}


def sample_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What the sample list and the tree need of a trajectory, without its tokens."""
    metrics = _dict(record.get("metrics"))
    turns = [t for t in record.get("turns") or [] if isinstance(t, dict)]
    last_info = _dict(turns[-1].get("info")) if turns else {}
    observations = [m.get("content", "") for t in turns for m in t.get("observation") or [] if isinstance(m, dict)]
    return {"id": str(record.get("id")), "parent_id": record.get("parent_id"), "depth": record.get("depth", 0),
            "step": metrics.get("train_step"), "reward": record.get("reward"), "advantage": metrics.get("advantage"),
            "stop_reason": record.get("stop_reason"), "error": record.get("error"), "env_id": record.get("env_id"),
            "group_id": record.get("group_id"), "sample_index": record.get("sample_index"),
            "step_index": record.get("step_index"), "title": _preview(record),
            "final_answer": _clip(last_info.get("final_answer")),
            "truncated_reason": last_info.get("truncated_reason"),
            "refusals": sum(" refused: " in str(text) for text in observations)}


def sample_detail(run: Run, sample_id: str) -> dict[str, Any]:
    """The stored trajectory ``sample_id`` with ``token_text`` (prompt and response) when a tokenizer loads."""
    for record in run.samples().records:
        if str(record.get("id")) == sample_id:
            model = run.model_name()
            return {**record, "summary": sample_summary(record),
                    "token_text": {"prompt": token_texts(model, _ints(record.get("prompt_ids"))),
                                   "response": token_texts(model, _ints(record.get("response_ids")))}}
    raise NotFound(f"no sample {sample_id!r} in {run.path}")


def _run(runs: Sequence[Run], index: str) -> Run:
    number = _int(index, default=-1)
    if not 0 <= number < len(runs):
        raise NotFound(f"no run number {index!r} (there are {len(runs)})")
    return runs[number]


def _preview(record: dict[str, Any]) -> str:
    """A line to name the trajectory by: a child's sub-call prompt, else the first user message."""
    task = _dict(record.get("task"))
    if record.get("parent_id") is not None and task.get("prompt"):
        return _clip(task["prompt"]) or ""
    for message in record.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            return _clip(message.get("content")) or ""
    return _clip(task.get("prompt") or task.get("question") or task.get("id")) or ""


def _clip(value: Any) -> str | None:
    if value is None:
        return None
    text = " ".join(str(value).split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ints(value: Any) -> list[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default
