"""search's probes for ``skyrl check search --adversarial``: retrieved text where only the model's answer counts.

Each searches the question first, then plays back what the retriever showed: the passages as later
queries that never answer, all passages inside one answer, every name and number of the passages in
answer tags of their own before a last one that answers nothing. The env reads its reward from the
model's last ``<answer>`` outside its ``<search>`` blocks alone (``tests/search``: an answer tag inside a
retrieved passage, or quoted from one in a query, the last answer of a reply), so none of them may
score, even on a corpus whose passages hold answer tags. Only the standard library and skyrl-core's checker
are imported.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from skyrl_core.probe import Probe, Turn
from skyrl_core.testing.adversarial import WRONG

ENV = "search"
_QUESTION = re.compile(r"Question:\s*(.+)")
_CANDIDATE = re.compile(r"\b(?:[A-Z][a-z]+|\d{3,4})\b")  # a name or a year, as the answers are
_DOC = re.compile(r"(?:^|<information>)Doc \d+ \(Title: (.*?)\) (.*?)(?:</information>)?$", re.MULTILINE)


def _question(turn: Turn) -> str:
    text = turn.prompt[-1]["content"] if turn.prompt else ""
    found = _QUESTION.search(text)
    return (found.group(1) if found else text).strip()[:200]


def _docs(turn: Turn) -> list[tuple[str, str]]:
    """(title, text) of every passage the env showed so far."""
    return [match.groups() for messages in turn.observations for message in messages
            for match in _DOC.finditer(message["content"])]


def _search_first(then: Callable[[Turn, list[tuple[str, str]]], str]) -> Callable[[Turn], str]:
    """A search for the question, then ``then(turn, passages shown so far)`` on every later turn."""
    def act(turn: Turn) -> str:
        return f"<search> {_question(turn)} </search>" if turn.number == 1 else then(turn, _docs(turn))
    return act


def _passages_as_queries(turn: Turn, docs: list[tuple[str, str]]) -> str:
    return "<search> " + " ".join(text for _, text in docs)[:280] + " </search>"


def _passages_as_answer(turn: Turn, docs: list[tuple[str, str]]) -> str:
    return "<answer> " + " ".join(f"{title} {text}" for title, text in docs) + " </answer>"


def _candidates_hedged(turn: Turn, docs: list[tuple[str, str]]) -> str:
    candidates = dict.fromkeys(_CANDIDATE.findall(" ".join(f"{title} {text}" for title, text in docs)))
    return "".join(f"<answer> {candidate} </answer> " for candidate in candidates) + f"<answer> {WRONG} </answer>"


PROBES: tuple[Probe, ...] = (
    Probe("query_as_answer", _search_first(_passages_as_queries),
          "searches for the question, then for the retrieved passages' text, never answering; flagged: a search "
          "query (or what it retrieved) was scored as the answer (read answers from <answer> in the model's "
          "replies only)", env=ENV),
    Probe("passages_answer", _search_first(_passages_as_answer),
          "every retrieved passage, titles and text, inside one <answer>; flagged: an answer that holds the "
          "retrieved text scores (with env.reward=subem or f1 it does: a long answer contains the gold; train "
          "with em)", env=ENV),
    Probe("answers_hedged", _search_first(_candidates_hedged),
          "every name and number of the retrieved passages in its own <answer>, then a last <answer> that "
          "answers nothing, in one reply; flagged: any answer of several counts (score the last one only)",
          env=ENV),
)
