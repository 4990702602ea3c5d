"""Evidence-task rows: the JSONL format, its validation (errors name the line) and the built-in set.

One row per line::

    {"id": "t01", "split": "train", "question": "Which passages report ...?",
     "papers": {"paper_id": {"Title": "...", "Abstract": "...", "2 Method": "..."}},
     "evidence": ["verbatim snippet", {"paper": "paper_id", "section": "2 Method", "text": "..."}]}

``evidence`` entries are strings or objects with a ``text`` field; every one must occur in the
papers (checked with the reward's noise-tolerant matching).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skyrl_rlm_repl.evidence.reward import SourceIndex

BUILTIN_PATH = Path(__file__).with_name("data") / "evidence_tasks.jsonl"
SPLITS = ("train", "validation", "test")


class DatasetError(ValueError):
    """A dataset file or row is malformed; the message names the file and line."""


def load_tasks(path: str | Path | None = None, split: str | None = None) -> list[dict[str, Any]]:
    """Validated rows of ``path`` (default: the built-in set), optionally only one split."""
    path = Path(path) if path is not None else BUILTIN_PATH
    if split is not None and split not in SPLITS:
        raise DatasetError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(f"dataset file {str(path)!r} does not exist") from None
    rows = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = validate_row(json.loads(line))
        except (json.JSONDecodeError, ValueError) as exc:
            raise DatasetError(f"{path}:{number}: {exc}") from None
        if row["id"] in seen:
            raise DatasetError(f"{path}:{number}: duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = number
        if split is None or row["split"] == split:
            rows.append(row)
    if not rows:
        raise DatasetError(f"{path}: no rows" + (f" in split {split!r}" if split else ""))
    return rows


def validate_row(row: Any) -> dict[str, Any]:
    """The row with evidence normalised to strings; raises ``ValueError`` naming the bad field."""
    if not isinstance(row, Mapping):
        raise ValueError(f"a row must be a JSON object, got {type(row).__name__}")
    missing = [key for key in ("id", "question", "papers", "evidence") if key not in row]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    if not isinstance(row["question"], str) or not row["question"].strip():
        raise ValueError("'question' must be a non-empty string")
    papers = row["papers"]
    if not isinstance(papers, Mapping) or not papers:
        raise ValueError("'papers' must be a non-empty object {paper_id: {section: text}}")
    for paper, sections in papers.items():
        if not isinstance(sections, Mapping) or not all(isinstance(t, str) for t in sections.values()):
            raise ValueError(f"papers[{paper!r}] must be an object {{section: text}} of strings")
    evidence = row["evidence"]
    if not isinstance(evidence, list) or not evidence:
        raise ValueError("'evidence' must be a non-empty list")
    source = SourceIndex(papers)
    texts = []
    for index, item in enumerate(evidence):
        text = item.get("text") if isinstance(item, Mapping) else item
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"evidence[{index}] must be a non-empty string or an object with a 'text' string")
        if not source.contains(text):
            raise ValueError(f"evidence[{index}] does not occur in the papers: {text[:80]!r}")
        texts.append(text)
    split = row.get("split", "train")
    if split not in SPLITS:
        raise ValueError(f"'split' must be one of {list(SPLITS)}, got {split!r}")
    return {**row, "id": str(row["id"]), "evidence": texts, "split": split}
