"""The JSON API the page reads, as plain functions of a path: the server answers with them on each
request (so the page sees a run as it grows) and ``--export`` stores their answers in the HTML file.

    /api/runs                        the runs: name, path, model, env, steps, problems; an evaluation
                                     (a results folder of ``skyrl eval``) also its ``eval`` summary
    /api/runs/<i>/metrics?from=N     metrics rows (from row N on), total row count, problems
    /api/runs/<i>/samples            one summary per stored trajectory (tree links, reward, stop)
    /api/runs/<i>/samples/<id>       one trajectory, plus the text of its tokens; a trajectory whose
                                     texts hold more than ``max_sample_chars`` characters comes with
                                     its longest texts cut and ``cut_chars`` saying how much was cut
    /api/runs/<i>/samples/<id>/full  the stored trajectory as it is, nothing cut

``<id>`` is percent-encoded by :func:`sample_path` (the page's ``sampleUrl`` encodes the same way).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from skyrl_viewer.runs import Run
from skyrl_viewer.tokens import token_texts

PREVIEW_CHARS = 160
DEFAULT_MAX_SAMPLE_CHARS = 256 << 10
MIN_CUT_CHARS = 1000  # no text is cut shorter than this
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class NotFound(Exception):
    """A path the API does not know, or a run or sample that is not there."""


def answer(runs: Sequence[Run], url: str, max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS) -> dict[str, Any]:
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
        return {"sample": sample_detail(run, path[4], max_sample_chars)}
    if len(path) == 6 and path[3] == "samples" and path[5] == "full":
        return {"sample": _sample(run, path[4])}
    raise NotFound(f"no API at {parts.path}")


def sample_path(run_index: int, sample_id: str) -> str:
    """The API path of a sample: every byte of its UTF-8 id but ``A-Z a-z 0-9 - . _ ~`` percent-encoded (a lone
    surrogate too, so that an id holding one cannot stop an export)."""
    return f"/api/runs/{run_index}/samples/{quote(sample_id, safe='', errors='surrogatepass')}"


def to_json(value: Any) -> str:
    """JSON text a browser parses: NaN and infinities (``metrics.jsonl`` may hold them) become null, and a lone
    surrogate (a run file may hold its escape) its escape again, so that the text encodes as UTF-8."""
    text = json.dumps(_finite(value), allow_nan=False, ensure_ascii=False, default=str)
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


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
    summary = {"index": index, "name": run.name, "path": str(run.path), "model": run.model_name(),
               "env": env.get("id") if isinstance(env, dict) else None,
               "steps": len(metrics.records), "problems": metrics.problems}
    evaluation = run.evaluation()
    if evaluation is not None:  # what skyrl eval wrote: eval.json (info), metrics.json, per_task.json
        summary["eval"] = evaluation
    return summary


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


def sample_detail(run: Run, sample_id: str, max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS) -> dict[str, Any]:
    """The stored trajectory ``sample_id`` with ``token_text`` (prompt and response) when a tokenizer loads.

    When its texts hold more than ``max_sample_chars`` characters together, the longest are cut to a common
    length (each ends with a note of how much is missing) and ``cut_chars`` counts what was cut.
    """
    record = _sample(run, sample_id)
    shown, cut = _cut_texts(record, max_sample_chars)
    model = run.model_name()
    return {**shown, "summary": sample_summary(record), "cut_chars": cut,
            "token_text": {"prompt": token_texts(model, _ints(record.get("prompt_ids"))),
                           "response": token_texts(model, _ints(record.get("response_ids")))}}


def _sample(run: Run, sample_id: str) -> dict[str, Any]:
    for record in run.samples().records:
        if str(record.get("id")) == sample_id:
            return record
    raise NotFound(f"no sample {sample_id!r} in {run.path}")


def _cut_texts(record: dict[str, Any], budget: int) -> tuple[dict[str, Any], int]:
    """``record`` with its longest texts cut so that all its texts hold about ``budget`` characters, and how many
    characters were cut (0: ``record`` itself)."""
    lengths = [len(text) for text in _texts(record)]
    if sum(lengths) <= budget:
        return record, 0
    cap = max(_common_length(lengths, budget), MIN_CUT_CHARS)

    def cut(text: str) -> str:
        return text if len(text) <= cap else f"{text[:cap]}… [{len(text) - cap:,} more characters cut]"

    return _map_texts(record, cut), sum(max(length - cap, 0) for length in lengths)


def _common_length(lengths: list[int], budget: int) -> int:
    """The length ``c`` such that cutting every text longer than ``c`` to ``c`` leaves at most ``budget`` in all."""
    longest = [*sorted(lengths, reverse=True), 0]
    rest, count = sum(lengths), 0
    while True:  # cut the longest ``count`` texts to a common length that stays at least the next one's
        rest -= longest[count]
        count += 1
        common = (budget - rest) // count
        if common >= longest[count]:
            return common


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (dict, list)):
        for child in value.values() if isinstance(value, dict) else value:
            yield from _texts(child)


def _map_texts(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: _map_texts(child, change) for key, child in value.items()}
    if isinstance(value, list):
        return [_map_texts(child, change) for child in value]
    return value


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
