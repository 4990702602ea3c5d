"""``search``: Search-R1-style question answering with a retriever, over several turns.

Each reply either answers (``<answer> ... </answer>``: the episode ends and is scored) or searches
(``<search> query </search>``: the top passages come back as a user message between
``<information>`` and ``</information>``, as readable text). A reply with neither is told the
format. The last allowed reply ends the episode whatever it holds; without an answer it scores 0.

The reward (only on the final turn) is the configured metric (``em``, ``subem`` or ``f1``) of the
last answer in the model's own replies against the row's answers. Each reply is read on its own:
observations are never searched for answers, and an ``<answer>`` inside a reply's ``<search>`` block
is part of the query (a model may quote a passage that holds one), not an answer. What a passage or
an error message holds is shown with the ``<`` of anything like the episode's tags written ``&lt;``,
so retrieved text never looks like the end of the ``<information>`` block or a turn of the model's.
All three metrics are reported by :meth:`SearchEnv.get_metrics` whatever the reward.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core import EnvConfig, StepResult, TextEnv, tags
from skyrl_core.data import DataError

from skyrl_search.config import SearchEnvConfig
from skyrl_search.data import builtin_questions, load_questions
from skyrl_search.prompts import prompt_messages
from skyrl_search.retrieval import Passage, RetrievalError, Retriever, make_retriever
from skyrl_search.reward import METRICS, answer_of

_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
EPISODE_TAGS = ("information", "search", "answer", "think")
RETRIEVAL_THREADS = 64  # searches in flight per process (each waits on the retriever, not the CPU)

FORMAT_HELP = ("Your reply had neither a search nor an answer. To look something up, reply with "
               "<search> your query </search>; to answer, reply with <answer> your answer </answer>.")
EMPTY_QUERY = ("Your search query was empty, so nothing was searched. Put the words to look up between "
               "<search> and </search>.")
NO_RESULTS = "No results found."

_retrievers: dict[tuple[str, str], Retriever] = {}
_retrievers_lock = threading.Lock()


def shared_retriever(name: str, options: Mapping[str, Any]) -> Retriever:
    """One retriever per process for each (name, options), made on first use and shared by all envs."""
    key = (name, json.dumps(dict(options), sort_keys=True, default=str))
    with _retrievers_lock:
        if key not in _retrievers:
            _retrievers[key] = make_retriever(name, options)
        return _retrievers[key]


@atexit.register
def _close_shared_retrievers() -> None:
    """Close pooled connections (the http retriever's) before the interpreter tears its sockets down."""
    with _retrievers_lock:
        retrievers = list(_retrievers.values())
        _retrievers.clear()
    for retriever in retrievers:
        close = getattr(retriever, "close", None)
        if callable(close):
            close()


def neutralize_tags(text: str) -> str:
    """``text`` with the ``<`` of anything like one of the episode's tags written ``&lt;`` (idempotent)."""
    return tags.neutralize_tags(text, EPISODE_TAGS)


def format_passages(passages: Sequence[Passage], max_chars: int) -> str:
    """``Doc 1 (Title: ...) text`` lines, each passage's text cut to ``max_chars`` characters, tag-like
    text neutralised (:func:`neutralize_tags`)."""
    if not passages:
        return NO_RESULTS
    lines = []
    for number, p in enumerate(passages, start=1):
        text = " ".join(p.text.split())
        if len(text) > max_chars:
            text = text[:max_chars].rstrip() + " ..."
        lines.append(neutralize_tags(f"Doc {number} (Title: {p.title}) {text}"))
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def _retrieval_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=RETRIEVAL_THREADS, thread_name_prefix="skyrl-search")


class SearchEnv(TextEnv):
    config_class = SearchEnvConfig
    config: SearchEnvConfig
    reward_range = (0.0, 1.0)

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: SearchEnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self._new_episode()

    def _new_episode(self) -> None:
        self.actions: list[str] = []  # the model's own replies: the only place answers are read from
        self.searches = 0
        self.empty_queries = 0
        self.long_queries = 0
        self.invalid_turns = 0
        self.retrieval_errors = 0
        self.latencies: list[float] = []
        self.outcome: dict[str, float] = {}

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self._new_episode()
        return super().reset(seed=seed, options=options)

    # -- task -------------------------------------------------------------------------------------

    @property
    def question(self) -> str:
        question = self.task.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"search task {self.task.get('id', '?')} has no 'question' (a non-empty string)")
        return question

    @property
    def answers(self) -> list[str]:
        answers = self.task.get("answers")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"search task {self.task.get('id', '?')} has no 'answers' (a non-empty list of strings)")
        return answers

    def build_prompt(self) -> list[dict[str, str]]:
        return prompt_messages(self.question, self.max_turns)

    def gold_actions(self) -> list[str] | None:
        queries = self.task.get("gold_queries")
        if not queries:
            return None
        return [f"<search> {q} </search>" for q in queries] + [f"<answer> {self.answers[0]} </answer>"]

    # -- turns ------------------------------------------------------------------------------------

    def take_action(self, action: str) -> StepResult:
        step = self._read(action)
        return step if isinstance(step, StepResult) else self._show(self._retrieve(step))

    async def atake_action(self, action: str) -> StepResult:
        step = self._read(action)
        if isinstance(step, StepResult):
            return step
        # A pool of its own: asyncio's default one (a few threads) would cap the searches in flight, and a
        # retrieval server batches only what arrives together.
        return self._show(await asyncio.get_running_loop().run_in_executor(_retrieval_pool(), self._retrieve, step))

    def reject_action(self, problem: str) -> StepResult:
        """An empty, non-text or over-long reply counts as an invalid turn."""
        self.invalid_turns += 1
        return super().reject_action(problem)

    def _read(self, action: str) -> StepResult | str:
        """The episode's end, an observation for a reply with no usable query, or the query to run."""
        self.actions.append(action)
        if answer_of(action) is not None or self.turn >= self.max_turns:
            return self._score()
        found = _SEARCH.search(action)  # the reply answers nothing outside its searches: its first one runs
        if found is None:
            self.invalid_turns += 1
            return self._reply(FORMAT_HELP, query_status="no_tags")
        query = found.group(1).strip()
        if not query:
            self.empty_queries += 1
            return self._reply(EMPTY_QUERY, query_status="empty")
        limit = self.config.max_query_chars
        if len(query) > limit:
            self.long_queries += 1
            return self._reply(f"Your search query was {len(query):,} characters; the limit is {limit:,}. It was not "
                               "run. Search again with a shorter query.", query_status="too_long")
        return query

    def _retrieve(self, query: str) -> list[Passage] | RetrievalError:
        c = self.config
        retriever = shared_retriever(c.retriever, c.retriever_options)
        self.searches += 1
        start = time.perf_counter()
        try:
            (passages,) = retriever.retrieve([query], c.topk)
        except RetrievalError as error:
            self.retrieval_errors += 1
            return error
        finally:
            self.latencies.append(time.perf_counter() - start)
        return list(passages)[:c.topk]

    def _show(self, result: list[Passage] | RetrievalError) -> StepResult:
        if isinstance(result, RetrievalError):
            return self._reply(f"<information>Search failed: {neutralize_tags(str(result))}</information>",
                               query_status="error")
        body = format_passages(result, self.config.max_passage_chars)
        return self._reply(f"<information>{body}</information>", query_status="ok" if result else "no_results")

    def _reply(self, text: str, **info: Any) -> StepResult:
        return StepResult([{"role": "user", "content": text}], 0.0, False, False, info)

    def _score(self) -> StepResult:
        answer = next((a for a in map(answer_of, reversed(self.actions)) if a is not None), None)
        scores = {name: metric(answer, self.answers) if answer is not None else 0.0
                  for name, metric in METRICS.items()}
        self.outcome = {"answered": float(answer is not None), **scores}
        reward = scores[self.config.reward]
        return StepResult([], reward, answer is not None, False, {"answer": answer, **scores})

    # -- metrics and data -------------------------------------------------------------------------

    def get_metrics(self) -> dict[str, float]:
        latency = sum(self.latencies) / len(self.latencies) if self.latencies else 0.0
        return {"searches": float(self.searches), "answered": 0.0, "em": 0.0, "subem": 0.0, "f1": 0.0,
                **self.outcome, "invalid_turns": float(self.invalid_turns),
                "empty_queries": float(self.empty_queries), "long_queries": float(self.long_queries),
                "retrieval_errors": float(self.retrieval_errors), "retrieval_latency_s": latency}

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        files = config.data_files if isinstance(config, SearchEnvConfig) else {}
        if not files:
            return builtin_questions(split)
        if split not in files:
            raise DataError(f"env.data_files has no split {split!r}; it has: {', '.join(sorted(files))}")
        return load_questions(files[split])
