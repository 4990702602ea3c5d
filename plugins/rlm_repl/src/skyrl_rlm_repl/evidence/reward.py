"""Deterministic evidence reward: snippet-level precision, recall and F1 with noise-tolerant matching.

Texts are compared by their *match key*: Unicode NFKC (so ligatures such as "ﬁ" become "fi"),
case-folded, keeping only letters and digits. That makes matching blind to whitespace, line
breaks, hyphenation breaks ("effec-\\ntive"), punctuation and quote styles, which is the noise PDF
extraction adds, but not to changed words.

A returned snippet is *grounded* when its key occurs in the key of some section of the papers;
ungrounded (invented or paraphrased) snippets can never match gold evidence and count as false
positives. Grounded snippets are paired one-to-one with gold snippets, best similarity first;
a pair counts when its similarity reaches ``threshold``. Similarity is the number of characters in
common (``difflib`` matching blocks over the keys) divided by the longer key, so a snippet that
covers 90 % of a gold sentence scores 0.9.
"""

from __future__ import annotations

import ast
import difflib
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def match_key(text: str) -> str:
    """``text`` reduced to case-folded letters and digits (see the module docstring)."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).casefold() if ch.isalnum())


def similarity(a: str, b: str) -> float:
    """Characters the two keys share (in order) over the longer key's length, in [0, 1]."""
    ka, kb = match_key(a), match_key(b)
    if not ka or not kb:
        return 0.0
    if ka == kb:
        return 1.0
    if ka in kb or kb in ka:
        return min(len(ka), len(kb)) / max(len(ka), len(kb))
    matcher = difflib.SequenceMatcher(None, ka, kb, autojunk=False)
    common = sum(block.size for block in matcher.get_matching_blocks())
    return common / max(len(ka), len(kb))


def parse_snippets(answer: Any) -> list[str]:
    """The snippets in a final answer: a list (JSON or Python literal), one string, or blank-line-separated text."""
    if isinstance(answer, (list, tuple)):
        return [str(s) for s in answer]
    text = str(answer).strip()
    if not text:
        return []
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (list, tuple)):
            return [str(s) for s in value]
        if isinstance(value, str):
            return [value]
        break
    return [part.strip() for part in text.split("\n\n") if part.strip()]


@dataclass(frozen=True)
class EvidenceScore:
    precision: float
    recall: float
    f1: float
    grounded: float
    predicted: int
    gold: int

    def as_dict(self) -> dict[str, float]:
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1,
                "grounded_fraction": self.grounded, "predicted": float(self.predicted), "gold": float(self.gold)}


class SourceIndex:
    """Match keys of every section, to check that snippets really occur in the papers."""

    def __init__(self, papers: Mapping[str, Mapping[str, str]] | str) -> None:
        self.keys = [match_key(text) for text in _section_texts(papers)]

    def contains(self, snippet: str) -> bool:
        key = match_key(snippet)
        return bool(key) and any(key in section for section in self.keys)


def _section_texts(papers: Any) -> Iterable[str]:
    if isinstance(papers, str):
        yield papers
    elif isinstance(papers, Mapping):
        for value in papers.values():
            yield from _section_texts(value)
    elif isinstance(papers, (list, tuple)):
        for value in papers:
            yield from _section_texts(value)


def score_evidence(predicted: Sequence[str], gold: Sequence[str], source: SourceIndex,
                   threshold: float = 0.8) -> EvidenceScore:
    """Precision/recall/F1 of ``predicted`` against ``gold``; ungrounded predictions never match."""
    grounded = [i for i, snippet in enumerate(predicted) if source.contains(snippet)]
    pred_len = {i: len(match_key(predicted[i])) for i in grounded}
    gold_len = [len(match_key(g)) for g in gold]
    # similarity <= shorter / longer key length, so pairs of very different lengths are skipped unscored.
    candidates = [(i, j) for i in grounded for j in range(len(gold))
                  if min(pred_len[i], gold_len[j]) >= threshold * max(pred_len[i], gold_len[j], 1)]
    pairs = sorted(((similarity(predicted[i], gold[j]), i, j) for i, j in candidates), reverse=True)
    used_pred: set[int] = set()
    used_gold: set[int] = set()
    for score, i, j in pairs:
        if score < threshold:
            break
        if i not in used_pred and j not in used_gold:
            used_pred.add(i)
            used_gold.add(j)
    hits = len(used_pred)
    if not predicted and not gold:
        precision = recall = 1.0
    else:
        precision = hits / len(predicted) if predicted else 0.0
        recall = hits / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    grounded_fraction = len(grounded) / len(predicted) if predicted else 0.0
    return EvidenceScore(precision, recall, f1, grounded_fraction, len(predicted), len(gold))
