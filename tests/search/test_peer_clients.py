"""The peers' retrieval clients against the retrieval server with its default limits (real uvicorn on loopback).

Search-R1 is not a package, so its two clients are reproduced here request for request: both send
``requests.post(url, json={"queries": [...], "topk": k, "return_scores": True})`` with no retries,
its ``retrieval_request.py`` example 400 queries at top 5, its trainer's ``batch_search`` every search
of a rollout batch at top 3 (its GRPO recipe: 512 prompts x 5 samples = 2,560 queries) and reads each
hit's ``document.contents`` as a title line and text. (Here with a timeout, so that a hung server fails
the test; theirs has none.) SkyRL's search tool, ``skyrl_gym.tools.search``, is called as published
(``pip install skyrl-gym``): one single-form request per search, 30 s timeout, retries on 5xx and timeouts.

Then what the defaults still refuse, and the two ways a request stops costing retrieval time: its
time budget, and its client going away.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from skyrl_search.bm25 import BM25Retriever
from skyrl_search.config import DEFAULT_MAX_PASSAGES, DEFAULT_MAX_QUERIES
from skyrl_search.corpus import write_corpus_jsonl
from skyrl_search.data import builtin_questions
from skyrl_search.http_client import HttpRetriever
from skyrl_search.retrieval import Passage

requests = pytest.importorskip("requests", reason="Search-R1's clients post with requests")
pytest.importorskip("fastapi")
from skyrl_search.server import MAX_QUERY_CHARS, QUERY_BYTES, http_limits  # noqa: E402 - needs the server extra

SEARCH_R1_EXAMPLE = ["What is the capital of France?", "Explain neural networks."] * 200  # retrieval_request.py
PROMPTS, SAMPLES = 512, 5  # Search-R1's GRPO recipe: train_batch_size 512, n_agent 5
# A corpus the example's two questions find passages in (the built-in one has neither France nor neural networks).
EXAMPLE_CORPUS = [Passage(f"capital-{city}", city, f"{city} is the capital of {country}.") for city, country in [
    ("Paris", "France"), ("Berlin", "Germany"), ("Lima", "Peru"), ("Quito", "Ecuador"), ("Rome", "Italy"),
    ("Oslo", "Norway")]] + [
    Passage("neural-network", "Neural network", "A neural network is a model of layers of units; networks learn."),
    *(Passage(f"network-{kind}", f"{kind.title()} network", f"A {kind} network carries messages; networks grow.")
      for kind in ("computer", "telephone", "railway", "social", "road"))]


class Turns:
    """A retriever around another: records each call's queries; with ``gate`` closed, every call waits for it,
    and with ``turns``, for one release each, so that the test lets calls run one at a time. (It waits longer
    than ``wait_until``: a call that gave up would fail its request, which a test could take for a drop.)"""

    def __init__(self, inner: Any, *, gate: threading.Event | None = None,
                 turns: threading.Semaphore | None = None) -> None:
        self.inner = inner
        self.gate = gate
        self.turns = turns
        self.batches: list[list[str]] = []

    def __len__(self) -> int:
        return len(self.inner)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        self.batches.append(list(queries))
        if self.gate is not None:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
        if self.turns is not None:
            assert self.turns.acquire(timeout=60), "the test never let this call run"
        return self.inner.retrieve(queries, topk)


class Echo:
    """Answers every query with ``topk`` copies of one passage (no ranking cost): for requests at the caps."""

    def __len__(self) -> int:
        return 1

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[Passage("p", "Title", "Text.", 1.0)] * topk for _ in queries]


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    """The built-in corpus's index (built on first use into the session's SKYRL_SEARCH_CACHE)."""
    return BM25Retriever.from_options({"progress": False})


def rollout_batch() -> list[str]:
    """The searches of one Search-R1 GRPO step: each of 5 samples of 512 prompts searches its question or
    one of its gold queries (a model's searches are about that long: the body is about 100 kB)."""
    questions = builtin_questions("train")[:PROMPTS]
    return [q["question"] if sample % 2 == 0 else q["gold_queries"][sample // 2 % len(q["gold_queries"])]
            for q in questions for sample in range(SAMPLES)]


def search_r1_post(url: str, queries: list[str], topk: int) -> requests.Response:
    """What Search-R1's clients send (see the module docstring)."""
    return requests.post(url, json={"queries": queries, "topk": topk, "return_scores": True}, timeout=300)


def search_r1_read(result: list[list[dict[str, Any]]]) -> list[list[tuple[str, str]]]:
    """(id, title) of each hit, the title as Search-R1's trainer reads it: the first line of ``contents``."""
    return [[(hit["document"]["id"], hit["document"]["contents"].split("\n")[0]) for hit in hits] for hits in result]


def in_process(bm25: BM25Retriever, queries: list[str], topk: int) -> list[list[tuple[str, str]]]:
    return [[(p.id, f'"{p.title}"') for p in found] for found in bm25.retrieve(queries, topk)]


def health(server: Any) -> dict[str, Any]:
    return httpx.get(f"{server.base_url}/health", timeout=10).json()


def wait_until(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.01)


def assert_refusal(status: int, body: bytes, expected: int, *named: str) -> None:
    """A 4xx ``expected`` whose small body names each of ``named`` and repeats none of the request."""
    assert status == expected, body[:300]
    assert len(body) < 2_000 and b"xxxxxxxx" not in body, body[:300]
    for name in named:
        assert name in body.decode(), body[:300]


# --- the peers' batches are served by default ---------------------------------------------------------------------


def test_search_r1s_example_of_400_queries_is_answered(retrieval_server, tmp_path):
    write_corpus_jsonl(EXAMPLE_CORPUS, tmp_path / "corpus.jsonl")
    bm25 = BM25Retriever.build_index(tmp_path / "corpus.jsonl", tmp_path / "index", progress=False)
    server = retrieval_server(bm25)
    response = search_r1_post(server.url, SEARCH_R1_EXAMPLE, 5)
    response.raise_for_status()  # as the example does
    read = search_r1_read(response.json()["result"])
    assert read == in_process(bm25, SEARCH_R1_EXAMPLE, 5)
    assert [hits[0][1] for hits in read[:2]] == ['"Paris"', '"Neural network"'] and {len(h) for h in read} == {5}


def test_search_r1s_trainer_gets_a_whole_rollout_batch_answered_in_one_request(retrieval_server, bm25):
    server = retrieval_server(bm25)
    queries = rollout_batch()
    assert len(queries) == 2_560 and 90_000 < len(json.dumps({"queries": queries})) < 200_000
    result = search_r1_post(server.url, queries, 3).json()["result"]  # as batch_search reads it
    assert search_r1_read(result) == in_process(bm25, queries, 3)  # every sample gets its own passages
    assert health(server)["queries_served"] == 2_560


def test_our_batched_client_sends_a_whole_rollout_batch_too(retrieval_server, bm25):
    server = retrieval_server(bm25)
    queries = rollout_batch()
    with HttpRetriever(server.url, retries=0) as client:
        assert client.retrieve(queries, 3) == bm25.retrieve(queries, 3)


def test_skyrls_search_tool_is_answered_between_the_parts_of_a_search_r1_batch(retrieval_server, bm25):
    search_tool = pytest.importorskip("skyrl_gym.tools.search", reason="SkyRL's client: pip install skyrl-gym")
    turns = threading.Semaphore(0)
    retriever = Turns(bm25, turns=turns)
    server = retrieval_server(retriever)
    queries = rollout_batch()  # 40 parts of 64, the server's max_batch
    question = builtin_questions("test")[0]
    tool = search_tool.SearchToolGroup(search_url=server.url, topk=3, log_requests=False)
    try:
        with ThreadPoolExecutor(2) as pool:
            batch = pool.submit(search_r1_post, server.url, queries, 3)
            wait_until(lambda: batch.done() or retriever.batches, "the batch's first part reached the retriever")
            assert not batch.done(), batch.result().text[:300]
            search = pool.submit(tool.search, question["gold_queries"][0])
            wait_until(lambda: health(server)["queries_waiting"] == 2_560 - 64 + 1, "SkyRL's search is queued")
            turns.release(2)  # the batch's first part, then the call that holds SkyRL's search
            observation = json.loads(search.result())["result"]
            assert f'"{bm25.retrieve([question["gold_queries"][0]], 1)[0][0].title}"' in observation
            assert not batch.done()  # it did not wait for the whole batch
            turns.release(len(queries))
            assert search_r1_read(batch.result().json()["result"]) == in_process(bm25, queries, 3)
    finally:
        search_tool.SearchToolGroup._session_pool.pop(server.base_url).close()  # its class-wide session


def test_a_request_at_every_cap_at_once_is_answered(retrieval_server):
    server = retrieval_server(Echo())
    query = "q" * (MAX_QUERY_CHARS - 400) + "\u00e9" * 400  # sent escaped: 6 bytes a character, QUERY_BYTES in all
    body = json.dumps({"queries": [query] * DEFAULT_MAX_QUERIES, "topk": DEFAULT_MAX_PASSAGES // DEFAULT_MAX_QUERIES})
    assert len(json.dumps(query)) == QUERY_BYTES + 2
    response = httpx.post(server.url, content=body, headers={"Content-Type": "application/json"}, timeout=300)
    assert response.status_code == 200, response.text[:300]
    assert [len(hits) for hits in response.json()["result"]] == [4] * DEFAULT_MAX_QUERIES
    assert len(body) > http_limits(DEFAULT_MAX_QUERIES).max_body_bytes - 64 * 1024  # its size is at the limit too


# --- what the defaults still refuse --------------------------------------------------------------------------------


def test_one_query_more_than_the_cap_is_refused_naming_the_option(retrieval_server):
    server = retrieval_server(Echo())
    response = search_r1_post(server.url, ["x" * 100] * (DEFAULT_MAX_QUERIES + 1), 3)
    assert_refusal(response.status_code, response.content, 422, "at most 4096 queries", "--max-queries")


def test_more_passages_than_the_cap_are_refused_naming_the_option(retrieval_server):
    server = retrieval_server(Echo())
    response = search_r1_post(server.url, ["x" * 100] * DEFAULT_MAX_QUERIES, 5)
    assert_refusal(response.status_code, response.content, 422, "at most 16384 passages", "4096 x 5", "--max-passages")


def test_a_flood_of_json_values_is_refused_before_parsing(retrieval_server):
    server = retrieval_server(Echo())
    response = httpx.post(server.url, json={"query": "xxxxxxxx", "pad": [0] * 10_000}, timeout=30)
    assert_refusal(response.status_code, response.content, 400, "more than 8,256 values")


def test_a_body_above_the_limit_is_refused_from_its_length_alone(retrieval_server):
    server = retrieval_server(Echo())
    address = urlsplit(server.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.putrequest("POST", "/retrieve")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(http_limits(DEFAULT_MAX_QUERIES).max_body_bytes + 1))
        connection.endheaders()  # and no body: the server answers before reading one
        response = connection.getresponse()
        assert_refusal(response.status, response.read(), 413, "larger than this server's limit of 16,449,536 bytes")
    finally:
        connection.close()


# --- a request stops costing retrieval time --------------------------------------------------------------------------


def test_a_request_past_its_time_budget_is_refused_and_the_rest_of_it_never_retrieved(retrieval_server):
    gate = threading.Event()
    retriever = Turns(Echo(), gate=gate)
    server = retrieval_server(retriever, max_batch=8, max_request_s=0.05)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(search_r1_post, server.url, [f"q{i}" for i in range(40)], 3)
        wait_until(lambda: retriever.batches, "the first part reached the retriever")
        time.sleep(0.1)  # the first call takes longer than the whole budget
        gate.set()
        response = answer.result()
        assert_refusal(response.status_code, response.content, 413, "time budget of 0.05 s", "8 of its 40 queries answered",
                       "--max-request-s")
    assert retriever.batches == [[f"q{i}" for i in range(8)]]
    assert health(server)["queries_waiting"] == 0
    assert search_r1_post(server.url, ["q"], 1).status_code == 200  # a new request has a budget of its own


def test_a_request_whose_client_went_away_is_dropped(retrieval_server):
    gate = threading.Event()
    retriever = Turns(Echo(), gate=gate)
    server = retrieval_server(retriever, max_batch=8)
    with pytest.raises(httpx.TimeoutException):  # as HttpRetriever or SkyRL's client gives up, before a retry
        httpx.post(server.url, json={"queries": [f"q{i}" for i in range(200)]}, timeout=0.5)
    wait_until(lambda: health(server)["queries_waiting"] == 0, "the server dropped the queries it had not taken")
    gate.set()
    assert search_r1_post(server.url, ["after"], 1).status_code == 200
    assert retriever.batches == [[f"q{i}" for i in range(8)], ["after"]]

