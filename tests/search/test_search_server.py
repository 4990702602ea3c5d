"""The retrieval server (real uvicorn on loopback) and the ``skyrl-search`` command line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from skyrl_search.cli import main
from skyrl_search.retrieval import Passage

pytest.importorskip("fastapi")
from skyrl_search.server import create_app  # noqa: E402 - needs the server extra


class KeywordRetriever:
    """Ranks passages by how many query words they contain; records every ``retrieve`` call's batch.

    With a ``gate``, every call waits until the test opens it, so that requests queue up behind it;
    with ``turns``, each call waits for one release of the semaphore, so the test lets calls run one by one.
    """

    def __init__(self, passages: Sequence[Passage], *, gate: threading.Event | None = None,
                 turns: threading.Semaphore | None = None, fail_on: str | None = None) -> None:
        self.passages = list(passages)
        self.gate = gate
        self.turns = turns
        self.fail_on = fail_on
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.passages)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        with self._lock:
            self.batches.append(list(queries))
        if self.gate is not None:
            assert self.gate.wait(timeout=30), "the test never opened the gate"
        if self.turns is not None:
            assert self.turns.acquire(timeout=30), "the test never let this call run"
        if self.fail_on is not None and self.fail_on in queries:
            raise RuntimeError(f"cannot rank {self.fail_on!r}")
        return [self._rank(query, topk) for query in queries]

    def _rank(self, query: str, topk: int) -> list[Passage]:
        words = set(query.lower().split())
        scored = []
        for index, passage in enumerate(self.passages):
            overlap = len(words & set(f"{passage.title} {passage.text}".lower().replace(".", "").split()))
            scored.append((-overlap, index, passage))
        scored.sort(key=lambda row: row[:2])
        return [Passage(p.id, p.title, p.text, float(-score)) for score, _, p in scored[:topk]]


FACTS = [
    Passage("paris", "Paris", "Paris is the capital of France."),
    Passage("berlin", "Berlin", "Berlin is the capital of Germany."),
    Passage("everest", "Mount Everest", "Mount Everest is the highest mountain on Earth."),
    Passage("amazon", "Amazon River", "The Amazon is the largest river by discharge volume."),
    Passage("python", "Python (programming language)", "Python is a programming language by Guido van Rossum."),
]
# One passage per marker word: the query "marker17" must come back with passage m17 first.
MARKED = [Passage(f"m{i}", f"Entry {i}", f"marker{i} appears only here.") for i in range(256)]


def post(url: str, body: Any) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.01)


def queued_behind_first_call(server: Any, retriever: KeywordRetriever) -> int:
    """Queries in the first (gated) retrieval call plus those the server holds waiting."""
    first = len(retriever.batches[0]) if retriever.batches else 0
    return first + httpx.get(f"{server.base_url}/health").json()["queries_waiting"]


def test_single_query_form_answers_one_list_of_bare_documents(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS))
    response = post(server.url, {"query": "capital of France"})
    assert response.status_code == 200
    (hits,) = response.json()["result"]
    assert len(hits) == 3  # the default topk
    assert hits[0] == {"id": "paris", "contents": '"Paris"\nParis is the capital of France.', "title": "Paris",
                       "text": "Paris is the capital of France."}
    assert all("score" not in hit and "document" not in hit for hit in hits)


def test_return_scores_wraps_each_document_with_its_score(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS))
    (hits,) = post(server.url, {"query": "capital of Germany", "topk": 2, "return_scores": True}).json()["result"]
    assert [hit["document"]["id"] for hit in hits] == ["berlin", "paris"]
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert hits[0]["document"]["contents"] == '"Berlin"\nBerlin is the capital of Germany.'


def test_batched_form_answers_one_list_per_query_in_order(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS))
    queries = ["highest mountain", "guido programming language", "largest river"]
    result = post(server.url, {"queries": queries, "topk": 1, "return_scores": True}).json()["result"]
    assert [[hit["document"]["id"] for hit in hits] for hits in result] == [["everest"], ["python"], ["amazon"]]


def test_missing_topk_falls_back_to_the_servers_default(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS), default_topk=5)
    (hits,) = post(server.url, {"query": "capital"}).json()["result"]
    assert len(hits) == 5
    (hits,) = post(server.url, {"query": "capital", "topk": 1}).json()["result"]
    assert len(hits) == 1


@pytest.mark.parametrize(("body", "named"), [
    ({"queries": []}, "queries"),
    ({"query": "capital", "topk": 0}, "topk"),
    ({"query": "capital", "queries": ["capital"]}, "exactly one of 'query'"),
    ({"topk": 2}, "exactly one of 'query'"),
    ({"query": "x" * 2001}, "query"),
    ({"queries": ["capital", "x" * 2001]}, "queries"),
    ({"query": "capital", "top_k": 2}, "top_k"),
    ({"query": "capital", "topk": 51}, "topk may be at most 50 (this server's max_topk; skyrl-search serve "
                                       "--max-topk N raises it)"),
    ({"queries": ["capital"] * 4097}, "at most 4096 queries (this server's max_queries; skyrl-search serve "
                                      "--max-queries N raises it)"),
    ({"queries": ["capital"] * 4096, "topk": 5}, "at most 16384 passages in all, its queries x topk (4096 x 5 here; "
                                                 "this server's max_passages: skyrl-search serve --max-passages N"),
    ({"query": "capital", "return_scores": "sometimes"}, "return_scores"),
    (["capital"], "body"),
], ids=["empty-queries", "topk-0", "both-forms", "neither-form", "long-query", "long-batched-query", "unknown-field",
        "topk-above-cap", "queries-above-cap", "passages-above-cap", "not-a-bool", "not-an-object"])
def test_invalid_requests_are_refused_naming_the_field(retrieval_server, body, named):
    retriever = KeywordRetriever(FACTS)
    server = retrieval_server(retriever)
    response = post(server.url, body)
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert any(named in error["msg"] or named in error["loc"] for error in errors), errors
    assert all(set(error) == {"type", "loc", "msg"} for error in errors), errors  # never the input
    assert retriever.batches == []


def test_the_caps_are_options_and_requests_at_them_are_answered(retrieval_server):
    server = retrieval_server(KeywordRetriever(MARKED), max_topk=4, max_queries=3, max_passages=10)
    result = post(server.url, {"queries": ["marker1", "marker2"], "topk": 4}).json()["result"]
    assert [len(hits) for hits in result] == [4, 4]
    assert "at most 4" in post(server.url, {"query": "marker1", "topk": 5}).json()["detail"][0]["msg"]
    assert "at most 3 queries" in post(server.url, {"queries": ["marker1"] * 4}).json()["detail"][0]["msg"]
    refused = post(server.url, {"queries": ["marker1", "marker2", "marker3"], "topk": 4}).json()["detail"]
    assert [error["msg"].split(" (")[0] for error in refused] == [
        "a request may ask for at most 10 passages in all, its queries x topk"]
    for options, message in [({"default_topk": 5, "max_topk": 4}, "default_topk must be between 1 and max_topk"),
                             ({"max_passages": 2}, r"max_passages must be at least default_topk \(3\), got 2"),
                             ({"max_request_s": 0}, "max_request_s must be positive, got 0")]:
        with pytest.raises(ValueError, match=message):
            create_app(KeywordRetriever(FACTS), **options)


@pytest.mark.parametrize("body", [
    {"query": "x" * 10_000_000},
    {"queries": ["capital"] + ["x" * 10_000] * 1000},
    {"query": "capital", "x" * 10_000_000: 1},
], ids=["10MB-query", "1000-long-queries", "10MB-field-name"])
def test_a_refusal_never_repeats_the_input(retrieval_server, body):
    server = retrieval_server(KeywordRetriever(FACTS))
    response = post(server.url, body)
    assert 400 <= response.status_code < 500
    assert len(response.content) < 5_000 and "x" * 300 not in response.text


@pytest.mark.parametrize("text", ['"\\ud800 capital"', '"capital \\udc00"'], ids=["high", "low"])
def test_a_lone_surrogate_is_a_client_error_not_a_500(retrieval_server, text):
    server = retrieval_server(KeywordRetriever(FACTS))
    for body in (f'{{"query": {text}}}', f'{{"queries": ["capital", {text}]}}', f'{{"query": "a", {text}: 1}}'):
        response = httpx.post(server.url, content=body.encode(), headers={"Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
        assert "detail" in response.json()
    assert post(server.url, {"query": "capital of France", "topk": 1}).json()["result"][0][0]["id"] == "paris"


# --- core's HTTP hygiene, as this server applies it ---------------------------------------------------------------


@pytest.mark.parametrize(("headers", "body", "status"), [
    ({"Host": "rebound.attacker.example"}, b'{"query": "capital"}', 421),
    ({"Content-Type": "text/plain"}, b'{"query": "capital"}', 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, b"query=capital", 415),
    ({}, b'{"query": "capital", "x": ' + b"[" * 40 + b"]" * 40 + b"}", 400),
    ({}, b'{"queries": [' + b'"a",' * 400 + b'"a"]}', 400),
    ({}, b'{"query": "' + b"x" * 4_000_000 + b'"}', 413),
    ({"Origin": "https://evil.example"}, b'{"query": "capital"}', 403),
    ({"Sec-Fetch-Site": "cross-site"}, b'{"query": "capital"}', 403),
    ({"Content-Type": ""}, b"", 415),
    ({"Content-Encoding": "gzip"}, b'{"query": "capital", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 415),
], ids=["foreign-host", "text-plain", "form", "nested", "too-many-values", "oversize", "foreign-origin", "cross-site",
        "empty-post", "gzip-label"])
def test_what_a_web_page_or_another_client_sends_is_refused_before_parsing(retrieval_server, headers, body, status):
    server = retrieval_server(KeywordRetriever(FACTS), max_queries=8)
    response = httpx.post(server.url, content=body, headers={"Content-Type": "application/json", **headers})
    assert response.status_code == status, response.text
    assert set(response.json()) == {"detail"} and len(response.content) < 1000
    assert post(server.url, {"query": "capital of France", "topk": 1}).json()["result"][0][0]["id"] == "paris"


def test_allowed_hosts_reach_the_server(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS), allowed_hosts=["search.lab"])
    response = httpx.post(server.url, json={"query": "capital"}, headers={"Host": "search.lab:8000"})
    assert response.status_code == 200 and response.json()["result"][0]
    assert httpx.get(f"{server.base_url}/health", headers={"Host": "evil.example"}).status_code == 421


def test_health_names_the_retriever_and_counts_passages_and_calls(retrieval_server):
    server = retrieval_server(KeywordRetriever(FACTS), name="keywords")
    post(server.url, {"queries": ["capital", "river"]})
    health = httpx.get(f"{server.base_url}/health").json()
    assert health == {"status": "ok", "retriever": "keywords", "passages": 5, "retrieve_calls": 1,
                      "queries_served": 2, "queries_waiting": 0}


def test_concurrent_requests_share_few_retrieval_calls_and_each_gets_its_own_answer(retrieval_server):
    gate = threading.Event()
    retriever = KeywordRetriever(MARKED, gate=gate)
    server = retrieval_server(retriever)

    def ask(i: int) -> list[str]:
        (hits,) = post(server.url, {"query": f"marker{i}", "topk": 1 + i % 3}).json()["result"]
        return [hit["id"] for hit in hits]

    with ThreadPoolExecutor(64) as pool:
        answers = pool.map(ask, range(64))
        wait_until(lambda: queued_behind_first_call(server, retriever) == 64, "all 64 queries reached the server")
        gate.set()
        answers = list(answers)
    assert [answer[0] for answer in answers] == [f"m{i}" for i in range(64)]
    assert [len(answer) for answer in answers] == [1 + i % 3 for i in range(64)]  # each its own topk
    assert sorted(q for batch in retriever.batches for q in batch) == sorted(f"marker{i}" for i in range(64))
    assert len(retriever.batches) == 2  # the first request alone, then everyone who queued behind it
    health = httpx.get(f"{server.base_url}/health").json()
    assert (health["retrieve_calls"], health["queries_served"], health["queries_waiting"]) == (2, 64, 0)


def test_max_batch_caps_the_queries_of_one_retrieval_call(retrieval_server):
    gate = threading.Event()
    retriever = KeywordRetriever(MARKED, gate=gate)
    server = retrieval_server(retriever, max_batch=8)
    with ThreadPoolExecutor(32) as pool:
        answers = pool.map(lambda i: post(server.url, {"query": f"marker{i}", "topk": 1}).json(), range(32))
        wait_until(lambda: queued_behind_first_call(server, retriever) == 32, "all 32 queries reached the server")
        gate.set()
        answers = list(answers)
    assert [answer["result"][0][0]["id"] for answer in answers] == [f"m{i}" for i in range(32)]
    first = len(retriever.batches[0])
    assert [len(batch) for batch in retriever.batches[1:]] == [8] * ((32 - first) // 8) + (
        [(32 - first) % 8] if (32 - first) % 8 else [])


def test_a_request_larger_than_max_batch_is_split_and_a_small_one_is_answered_between_its_parts(retrieval_server):
    turns = threading.Semaphore(0)
    retriever = KeywordRetriever(MARKED, turns=turns)
    server = retrieval_server(retriever, max_batch=8)
    big = [f"marker{i}" for i in range(40)]
    with ThreadPoolExecutor(2) as pool:
        big_answer = pool.submit(post, server.url, {"queries": big, "topk": 1})
        wait_until(lambda: len(retriever.batches) == 1, "the big request's first part reached the retriever")
        small_answer = pool.submit(post, server.url, {"query": "marker99", "topk": 1})
        wait_until(lambda: queued_behind_first_call(server, retriever) == 41, "the small request is queued")
        turns.release(2)  # the big request's first part, then the call that holds the small request
        assert small_answer.result().json()["result"][0][0]["id"] == "m99"
        assert not big_answer.done()  # its second part waits for a turn: the small one did not wait for all of it
        assert retriever.batches[1] == ["marker99"]  # in a call of its own, not beside the next part of the big one
        turns.release(4)
        result = big_answer.result().json()["result"]
    assert [hits[0]["id"] for hits in result] == [f"m{i}" for i in range(40)]
    assert [len(batch) for batch in retriever.batches] == [8, 1, 8, 8, 8, 8]
    assert httpx.get(f"{server.base_url}/health").json()["queries_waiting"] == 0


def test_a_failing_part_fails_only_its_own_large_request(retrieval_server):
    gate = threading.Event()
    retriever = KeywordRetriever(MARKED, gate=gate, fail_on="poison")
    server = retrieval_server(retriever, max_batch=4)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, server.url, {"query": "marker99", "topk": 1})
        wait_until(lambda: len(retriever.batches) == 1, "the first request reached the retriever")
        poisoned = pool.submit(post, server.url, {"queries": [f"marker{i}" for i in range(6)] + ["poison"]})
        healthy = pool.submit(post, server.url, {"queries": [f"marker{i}" for i in range(10, 16)], "topk": 1})
        wait_until(lambda: queued_behind_first_call(server, retriever) == 14, "both large requests are queued")
        gate.set()
        assert first.result().status_code == 200
        assert poisoned.result().status_code == 500 and "poison" in poisoned.result().json()["detail"]
        assert [hits[0]["id"] for hits in healthy.result().json()["result"]] == [f"m{i}" for i in range(10, 16)]
    assert httpx.get(f"{server.base_url}/health").json()["queries_waiting"] == 0


def test_a_failing_retrieval_is_a_500_with_its_message_and_spares_other_requests(retrieval_server):
    gate = threading.Event()
    retriever = KeywordRetriever(MARKED, gate=gate, fail_on="poison")
    server = retrieval_server(retriever)
    queries = ["poison", *(f"marker{i}" for i in range(15))]
    with ThreadPoolExecutor(17) as pool:
        first = pool.submit(post, server.url, {"query": "marker99", "topk": 1})
        wait_until(lambda: len(retriever.batches) == 1, "the first request reached the retriever")
        responses = pool.map(lambda q: post(server.url, {"query": q, "topk": 1}), queries)
        wait_until(lambda: queued_behind_first_call(server, retriever) == 17, "all queries reached the server")
        gate.set()
        responses = list(responses)
    assert first.result().json()["result"][0][0]["id"] == "m99"
    assert sorted(queries) in [sorted(batch) for batch in retriever.batches]  # poison was batched with the rest
    assert responses[0].status_code == 500
    assert "cannot rank 'poison'" in responses[0].json()["detail"]
    assert [r.json()["result"][0][0]["id"] for r in responses[1:]] == [f"m{i}" for i in range(15)]
    # The server keeps serving after a failure.
    assert post(server.url, {"query": "marker42", "topk": 1}).json()["result"][0][0]["id"] == "m42"


# --- the command line ---------------------------------------------------------------------------


def test_serve_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for option in ("--index", "--corpus", "--host", "--port", "--topk", "--retriever", "--max-topk", "--max-queries",
                   "--max-passages", "--max-request-s"):
        assert option in out
    assert "(default: 50; 422 above)" in out and "(default: 4096; 422 above)" in out
    assert "(default: 16384; 422 above)" in out and "(default: 1800; 413)" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--topk", "9", "--max-topk", "8"], "--topk must be between 1 and --max-topk (8), got 9"),
    (["--max-queries", "0"], "--max-queries must be at least 1, got 0"),
    (["--topk", "4", "--max-passages", "3"], "--max-passages must be at least --topk (4), got 3"),
    (["--max-request-s", "0"], "--max-request-s must be positive, got 0"),
], ids=["topk-above-cap", "no-queries", "passages-below-topk", "no-time"])
def test_serve_refuses_caps_that_cannot_serve_a_request(capsys, argv, message):
    assert main(["serve", *argv]) == 1
    assert message in capsys.readouterr().err


def test_index_of_a_missing_corpus_is_a_one_line_error(tmp_path, capsys):
    assert main(["index", "--corpus", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "index")]) != 0
    err = capsys.readouterr().err
    assert "nope.jsonl" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "index").exists()


def test_serve_with_a_missing_index_is_a_one_line_error(tmp_path, capsys):
    assert main(["serve", "--index", str(tmp_path / "no-index")]) != 0
    err = capsys.readouterr().err
    assert "no-index" in err and "skyrl-search index" in err and "Traceback" not in err


def test_serve_without_the_server_extra_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "skyrl_search.server")  # imported afresh, as in a new process
    monkeypatch.setitem(sys.modules, "fastapi", None)  # what Python does for a package that is not installed
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'skyrl-search[server]'" in err and "Traceback" not in err


def test_index_builds_a_bm25_index_that_answers_queries(tmp_path):
    bm25 = pytest.importorskip("skyrl_search.bm25", reason="skyrl_search.bm25 (BM25Retriever, build_index) not there yet")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p.as_document()) + "\n" for p in FACTS), encoding="utf-8")
    out = tmp_path / "index"
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 0
    retriever = bm25.BM25Retriever.from_options({"index_dir": str(out)})
    assert [hits[0].id for hits in retriever.retrieve(["highest mountain on earth", "capital of germany"], 1)] == [
        "everest", "berlin"]


def test_serve_runs_a_bm25_server_over_a_corpus_until_stopped(tmp_path):
    pytest.importorskip("skyrl_search.bm25", reason="skyrl_search.bm25 not there yet")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p.as_document()) + "\n" for p in FACTS), encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "skyrl_search.cli", "serve", "--corpus", str(corpus), "--index",
               str(tmp_path / "index"), "--port", str(port), "--topk", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert process.poll() is None, f"skyrl-search serve exited: {process.communicate()[0]}"
            try:
                return httpx.get(f"{base_url}/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, "the server answered /health")
        assert httpx.get(f"{base_url}/health").json()["passages"] == len(FACTS)
        (hits,) = post(f"{base_url}/retrieve", {"query": "capital of Germany"}).json()["result"]
        assert [hit["id"] for hit in hits] == ["berlin", "paris"]  # --topk 2
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_eval_is_delegated_to_the_evaluator(tmp_path, capsys):
    pytest.importorskip("skyrl_search.evaluate", reason="skyrl_search.evaluate not there yet")
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()

