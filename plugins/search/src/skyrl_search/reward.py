"""Search-R1's answer scoring: normalisation, exact match, substring match, token F1.

Normalisation (as in the SQuAD / Search-R1 evaluation): lowercase, drop punctuation, drop the
articles a / an / the, collapse whitespace. Every metric takes the best score over the gold answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from skyrl_core.tags import outside_blocks

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Lowercase, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised answer, else 0.0."""
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(a) for a in answers))


def substring_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 if a normalised answer occurs inside the normalised prediction, else 0.0."""
    predicted = normalize_answer(prediction)
    return float(any(normalize_answer(a) in predicted for a in answers if normalize_answer(a)))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """The best token-level F1 between the normalised prediction and an answer."""
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "em": exact_match, "subem": substring_match, "f1": token_f1}


def extract_answer(text: str) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` in ``text``; None if none."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def outside_searches(action: str) -> str:
    """``action`` with every complete ``<search>...</search>`` block blanked to spaces (positions kept).

    A query is the model's search, whatever it quotes (a passage it saw may hold ``<answer>`` tags), so
    what it holds is never read as an answer. A search opened inside an answer is the answer's text.
    """
    return outside_blocks(action, "search", "answer")


def answer_of(action: str) -> str | None:
    """The answer of one of the model's replies: its last complete ``<answer>`` outside its searches."""
    return extract_answer(outside_searches(action))
