"""The ``search`` env against the real retrieval server on loopback (``retriever="http"``).

The server is ``skyrl_search.server.create_app`` under uvicorn around the built-in corpus's BM25
index; the env reaches it through ``HttpRetriever`` with both request forms (``batched`` true: the
``{"queries": [...]}`` form; false: the single ``{"query": ...}`` form). Failures (server
down, too slow, answering 500) must reach the episode as a "Search failed" observation, never as an
exception, and the episode goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from skyrl_search.bm25 import BM25Retriever
from skyrl_search.data import builtin_questions
from skyrl_search.env import SearchEnv, format_passages
from skyrl_search.retrieval import Passage

pytest.importorskip("fastapi")

FORMS = pytest.mark.parametrize("batched", [True, False], ids=["batched-form", "single-form"])
TOPK = 3
MAX_PASSAGE_CHARS = 600


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    """The built-in corpus's index (built on first use into the session's SKYRL_SEARCH_CACHE)."""
    return BM25Retriever.from_options({"progress": False})


def http_config(url: str, **options: Any) -> dict[str, Any]:
    return {"retriever": "http", "retriever_options": {"url": url, **options}, "topk": TOPK,
            "max_passage_chars": MAX_PASSAGE_CHARS}


def expected_information(bm25: BM25Retriever, query: str) -> str:
    """What the env must show for ``query``: the same passages as in-process BM25 finds."""
    (passages,) = bm25.retrieve([query], TOPK)
    return f"<information>{format_passages(passages, MAX_PASSAGE_CHARS)}</information>"


def queries_served(server) -> int:
    return httpx.get(f"{server.base_url}/health", timeout=10).json()["queries_served"]


def sample_tasks(count_per_kind: int) -> list[dict[str, Any]]:
    """The first one-hop and the first two-hop questions of the test split."""
    questions = builtin_questions("test")
    one_hop = [q for q in questions if len(q["gold_queries"]) == 1][:count_per_kind]
    two_hop = [q for q in questions if len(q["gold_queries"]) == 2][:count_per_kind]
    assert len(one_hop) == len(two_hop) == count_per_kind
    return one_hop + two_hop


async def play_gold(env: SearchEnv, bm25: BM25Retriever) -> tuple[float, list[str]]:
    """Plays the task's gold actions; the final reward and the mismatching search observations (none)."""
    env.reset()
    mismatches = []
    actions = env.gold_actions()
    for query, action in zip(env.task["gold_queries"], actions[:-1], strict=True):
        obs, reward, terminated, truncated, info = await env.astep(action)
        assert not (terminated or truncated) and "error" not in info, info
        if obs != [{"role": "user", "content": expected_information(bm25, query)}]:
            mismatches.append(f"{env.task['id']} {query!r}: {obs}")
    obs, reward, terminated, truncated, info = await env.astep(actions[-1])
    assert terminated and not truncated and obs == [], info
    return reward, mismatches


class Stalled:
    """A retriever that holds every call until ``release`` is set (a server too slow for its clients)."""

    def __init__(self, inner: BM25Retriever) -> None:
        self.inner = inner
        self.release = threading.Event()

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        if not self.release.wait(timeout=120):
            raise RuntimeError("the test never released the stalled retriever")
        return self.inner.retrieve(queries, topk)


class Failing:
    """A retriever whose first ``failures`` calls raise (the server answers HTTP 500), then answers."""

    def __init__(self, inner: BM25Retriever, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        with self._lock:
            self.calls += 1
            failing = self.calls <= self.failures
        if failing:
            raise RuntimeError("the index file is corrupt")
        return self.inner.retrieve(queries, topk)


@FORMS
async def test_gold_actions_score_one_through_the_server(retrieval_server, bm25, batched):
    server = retrieval_server(bm25)
    tasks = sample_tasks(5)
    envs = [SearchEnv(task, http_config(server.url, batched=batched)) for task in tasks]
    for env in envs:
        reward, mismatches = await play_gold(env, bm25)
        assert reward == 1.0, (env.task, env.actions)
        assert mismatches == []
        metrics = env.get_metrics()
        assert metrics["searches"] == len(env.task["gold_queries"]) and metrics["retrieval_errors"] == 0.0
        assert metrics["em"] == metrics["answered"] == 1.0 and metrics["retrieval_latency_s"] > 0
    # Every search went over HTTP to this server: none was answered in-process.
    assert queries_served(server) == sum(len(task["gold_queries"]) for task in tasks)


@FORMS
async def test_server_down_gives_a_search_failed_observation_and_the_episode_goes_on(retrieval_server, bm25,
                                                                                     batched):
    server = retrieval_server(bm25)
    server.stop()  # nothing listens on its port any more
    task = sample_tasks(1)[0]
    env = SearchEnv(task, http_config(server.url, batched=batched, retries=1, backoff_s=0.0))
    env.reset()
    obs, reward, terminated, truncated, info = await env.astep(f"<search> {task['gold_queries'][0]} </search>")
    assert not (terminated or truncated) and "error" not in info and reward == 0.0
    (message,) = obs
    assert message["role"] == "user"
    assert message["content"].startswith("<information>Search failed: ")
    assert server.url in message["content"] and "2 attempt(s)" in message["content"]
    assert info["query_status"] == "error"
    # The episode goes on: the model can still answer and is scored as usual.
    obs, reward, terminated, truncated, info = await env.astep(f"<answer> {task['answers'][0]} </answer>")
    assert terminated and reward == 1.0
    metrics = env.get_metrics()
    assert metrics["retrieval_errors"] == 1.0 and metrics["searches"] == 1.0


@FORMS
async def test_a_server_slower_than_the_timeout_gives_search_failed_then_recovers(retrieval_server, bm25, batched):
    stalled = Stalled(bm25)
    server = retrieval_server(stalled)
    task = sample_tasks(1)[0]
    query = task["gold_queries"][0]
    env = SearchEnv(task, http_config(server.url, batched=batched, timeout_s=0.5, retries=0))
    env.reset()
    try:
        obs, reward, terminated, truncated, info = await env.astep(f"<search> {query} </search>")
    finally:
        stalled.release.set()
    assert not (terminated or truncated) and "error" not in info
    content = obs[0]["content"]
    assert content.startswith("<information>Search failed: ") and "timeout" in content, content
    # Once the server answers again, the same episode's next search gets real results.
    obs, reward, terminated, truncated, info = await env.astep(f"<search> {query} </search>")
    assert obs == [{"role": "user", "content": expected_information(bm25, query)}]
    obs, reward, terminated, truncated, info = await env.astep(f"<answer> {task['answers'][0]} </answer>")
    assert terminated and reward == 1.0
    assert env.get_metrics()["retrieval_errors"] == 1.0 and env.get_metrics()["searches"] == 2.0


@FORMS
async def test_http_500_errors_give_search_failed_with_the_servers_message(retrieval_server, bm25, batched):
    broken = Failing(bm25, failures=10**6)
    server = retrieval_server(broken)
    task = sample_tasks(1)[0]
    env = SearchEnv(task, http_config(server.url, batched=batched, retries=2, backoff_s=0.0))
    env.reset()
    obs, reward, terminated, truncated, info = await env.astep(f"<search> {task['gold_queries'][0]} </search>")
    assert not (terminated or truncated) and "error" not in info
    content = obs[0]["content"]
    assert content.startswith("<information>Search failed: ") and content.endswith("</information>")
    assert "HTTP 500" in content and "the index file is corrupt" in content and "3 attempt(s)" in content, content
    assert broken.calls == 3  # the first try and both retries reached the server
    obs, reward, terminated, truncated, info = await env.astep("<answer> not a clue </answer>")
    assert terminated and reward == 0.0 and env.get_metrics()["retrieval_errors"] == 1.0


@FORMS
async def test_retries_ride_out_transient_500_errors(retrieval_server, bm25, batched):
    flaky = Failing(bm25, failures=2)
    server = retrieval_server(flaky)
    task = sample_tasks(1)[0]
    query = task["gold_queries"][0]
    env = SearchEnv(task, http_config(server.url, batched=batched, retries=2, backoff_s=0.0))
    env.reset()
    obs, *_ = await env.astep(f"<search> {query} </search>")
    assert obs == [{"role": "user", "content": expected_information(bm25, query)}]
    assert flaky.calls == 3 and env.get_metrics()["retrieval_errors"] == 0.0


@FORMS
async def test_256_concurrent_episodes_against_one_server_drop_no_request(retrieval_server, bm25, batched):
    server = retrieval_server(bm25)
    tasks = builtin_questions("test")[:256]
    envs = [SearchEnv(task, http_config(server.url, batched=batched)) for task in tasks]
    outcomes = await asyncio.gather(*(play_gold(env, bm25) for env in envs))
    assert [reward for reward, _ in outcomes] == [1.0] * len(envs)
    assert [m for _, mismatches in outcomes for m in mismatches] == []
    assert sum(env.get_metrics()["retrieval_errors"] for env in envs) == 0.0
    searches = sum(len(task["gold_queries"]) for task in tasks)
    assert sum(env.get_metrics()["searches"] for env in envs) == searches
    assert queries_served(server) == searches
