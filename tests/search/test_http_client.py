"""``HttpRetriever`` against the real retrieval server on loopback, and against scripted stdlib servers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from skyrl_search.http_client import HttpRetriever
from skyrl_search.retrieval import Passage, RetrievalError, make_retriever

pytest.importorskip("fastapi")


class TableRetriever:
    """Answers each query from a lookup table (``q<i>`` -> passages ``p<i>``, ``p<i>b``); counts its calls.

    ``hold``: every call first waits for it (a slow retriever); ``error``: every call raises it.
    """

    def __init__(self, *, hold: threading.Event | None = None, error: str | None = None) -> None:
        self.hold = hold
        self.error = error
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        with self._lock:
            self.calls.append(list(queries))
        if self.hold is not None:
            self.hold.wait(timeout=30)
        if self.error is not None:
            raise RuntimeError(self.error)
        return [self._lookup(query)[:topk] for query in queries]

    @staticmethod
    def _lookup(query: str) -> list[Passage]:
        if not query.startswith("q"):
            return []
        i = query[1:]
        return [Passage(f"p{i}", f"Title {i}", f"Text of {i}.\nSecond line.", 2.5),
                Passage(f"p{i}b", f"Other {i}", f"More about {i}.", 1.25)]


class ScriptedServer:
    """A stdlib HTTP server on loopback: first the scripted ``(status, body)`` replies, one per request,
    then a peer server's behaviour: only the request form ``takes`` (``"query"``: the single form, as
    SkyRL's example retrieval server; ``"queries"``: the batched form, as Search-R1's retrieval server),
    FastAPI's 422 naming the missing field otherwise, and documents with ``contents`` only.
    ``requests`` holds every request body it got."""

    def __init__(self, replies: Sequence[tuple[int, str]] = (), takes: str = "query") -> None:
        self.replies = list(replies)
        self.takes = takes
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/retrieve"

    def _reply(self, body: dict[str, Any]) -> tuple[int, str]:
        with self._lock:
            self.requests.append(body)
            if self.replies:
                return self.replies.pop(0)
        if self.takes not in body:
            return 422, json.dumps({"detail": [{"type": "missing", "loc": ["body", self.takes], "msg": "Field required",
                                                "input": body}]})
        queries = [body["query"]] if self.takes == "query" else body["queries"]
        return 200, json.dumps({"result": [self._hits(query, body.get("topk") or 3) for query in queries]})

    @staticmethod
    def _hits(query: str, topk: int) -> list[dict[str, Any]]:
        return [{"document": {"id": f"{query}-{rank}", "contents": f'"About {query}"\nPassage {rank} on {query}.'},
                 "score": 10.0 - rank} for rank in range(topk)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, text = server._reply(body)
                payload = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
                pass

        return Handler

    @contextmanager
    def running(self) -> Iterator[ScriptedServer]:
        thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._http.shutdown()
            self._http.server_close()
            thread.join()


def client(url: str, **options: Any) -> HttpRetriever:
    return HttpRetriever(url, **{"timeout_s": 10.0, "retries": 2, "backoff_s": 0.01, **options})


def test_batched_client_returns_what_the_retriever_behind_the_server_returns(retrieval_server):
    retriever = TableRetriever()
    server = retrieval_server(retriever)
    with client(server.url) as http:
        got = http.retrieve(["q1", "q2", "nothing"], 2)
    assert got == TableRetriever().retrieve(["q1", "q2", "nothing"], 2)
    assert got[0][0] == Passage("p1", "Title 1", "Text of 1.\nSecond line.", 2.5)
    assert retriever.calls == [["q1", "q2", "nothing"]]  # one batched request


def test_unbatched_client_sends_one_single_form_request_per_query(retrieval_server):
    retriever = TableRetriever()
    server = retrieval_server(retriever)
    with client(server.url, batched=False) as http:
        assert http.retrieve(["q1", "q2", "q3"], 1) == TableRetriever().retrieve(["q1", "q2", "q3"], 1)
    assert sorted(q for call in retriever.calls for q in call) == ["q1", "q2", "q3"]


def test_unbatched_client_speaks_the_single_query_form_and_splits_contents():
    with ScriptedServer().running() as server, client(server.url, batched=False) as http:
        got = http.retrieve(["who wrote hamlet", "capital of peru"], 2)
    assert sorted(r["query"] for r in server.requests) == ["capital of peru", "who wrote hamlet"]
    assert all(r["topk"] == 2 and r["return_scores"] is True and "queries" not in r for r in server.requests)
    assert got[0] == [Passage("who wrote hamlet-0", "About who wrote hamlet", "Passage 0 on who wrote hamlet.", 10.0),
                      Passage("who wrote hamlet-1", "About who wrote hamlet", "Passage 1 on who wrote hamlet.", 9.0)]
    assert got[1][0].title == "About capital of peru"


def test_batched_client_speaks_search_r1s_batched_form():
    with ScriptedServer(takes="queries").running() as server, client(server.url) as http:
        got = http.retrieve(["who wrote hamlet", "capital of peru"], 1)
    assert server.requests == [{"queries": ["who wrote hamlet", "capital of peru"], "topk": 1, "return_scores": True}]
    assert [hits[0].id for hits in got] == ["who wrote hamlet-0", "capital of peru-0"]


def test_batched_client_against_a_single_form_server_says_to_turn_batching_off():
    with ScriptedServer(takes="query").running() as server, client(server.url) as http:
        with pytest.raises(RetrievalError, match="HTTP 422.*single form.*SkyRL's example.*batched: false") as error:
            http.retrieve(["q1", "q2"], 3)
    assert "Search-R1" not in str(error.value)
    assert len(server.requests) == 1  # a refusal is not retried


def test_unbatched_client_against_a_batched_form_server_says_to_turn_batching_on():
    with ScriptedServer(takes="queries").running() as server, client(server.url, batched=False) as http:
        with pytest.raises(RetrievalError, match="HTTP 422.*batched form.*Search-R1's.*batched: true") as error:
            http.retrieve(["q1"], 3)
    assert "SkyRL" not in str(error.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("batched", [True, False], ids=["batched-form", "single-form"])
def test_a_cap_refusal_from_our_server_names_the_cap_and_no_form(retrieval_server, batched):
    server = retrieval_server(TableRetriever(), max_topk=5)
    with client(server.url, batched=batched) as http:
        with pytest.raises(RetrievalError, match="HTTP 422.*topk may be at most 5") as error:
            http.retrieve(["q1"], 6)
    assert "batched:" not in str(error.value)


def test_bare_documents_without_scores_are_read_too():
    docs = [{"id": "9", "contents": '"Lima"\nLima is the capital of Peru.'}, {"contents": "no title line"},
            {"id": "3", "title": "Quito", "text": "Quito is in Ecuador.", "contents": "ignored"}]
    with ScriptedServer([(200, json.dumps({"result": [docs]}))]).running() as server, client(server.url) as http:
        (hits,) = http.retrieve(["capital"], 3)
    assert hits == [Passage("9", "Lima", "Lima is the capital of Peru.", 0.0), Passage("", "", "no title line", 0.0),
                    Passage("3", "Quito", "Quito is in Ecuador.", 0.0)]


def test_a_server_that_is_down_is_a_retrieval_error_naming_the_url_after_bounded_retries(retrieval_server):
    server = retrieval_server(TableRetriever())
    server.stop()
    with client(server.url, retries=2) as http:
        with pytest.raises(RetrievalError) as error:
            http.retrieve(["q1"], 1)
    assert server.url in str(error.value)
    assert "after 3 attempt(s)" in str(error.value) and "ConnectError" in str(error.value)


def test_a_server_slower_than_the_timeout_is_a_timeout_error(retrieval_server):
    hold = threading.Event()
    retriever = TableRetriever(hold=hold)
    server = retrieval_server(retriever)
    try:
        with client(server.url, timeout_s=0.3, retries=1) as http:
            with pytest.raises(RetrievalError, match=r"after 2 attempt\(s\); last error: timeout"):
                http.retrieve(["q1"], 1)
    finally:
        hold.set()


def test_a_failing_retriever_is_retried_then_reported_with_its_message(retrieval_server):
    retriever = TableRetriever(error="the index is corrupt")
    server = retrieval_server(retriever)
    with client(server.url, retries=2) as http:
        with pytest.raises(RetrievalError, match="HTTP 500.*the index is corrupt"):
            http.retrieve(["q1"], 1)
    assert retriever.calls == [["q1"]] * 3


def test_a_flaky_server_succeeds_thanks_to_retries():
    replies = [(500, "Internal Server Error"), (503, "overloaded")]
    with ScriptedServer(replies).running() as server, client(server.url, batched=False, retries=2) as http:
        (hits,) = http.retrieve(["q7"], 1)
    assert hits == [Passage("q7-0", "About q7", "Passage 0 on q7.", 10.0)]
    assert len(server.requests) == 3


def test_too_few_retries_for_a_flaky_server_report_its_last_error():
    replies = [(500, "Internal Server Error"), (503, "overloaded")]
    with ScriptedServer(replies).running() as server, client(server.url, batched=False, retries=1) as http:
        with pytest.raises(RetrievalError, match="after 2 attempt.*HTTP 503: overloaded"):
            http.retrieve(["q7"], 1)


@pytest.mark.parametrize(("status", "body", "message"), [
    (400, "topk is too large", "refused the request: HTTP 400: topk is too large"),
    (200, "<html>not json", "malformed JSON.*<html>not json"),
    (200, '{"result": 5}', "unexpected reply.*'result'"),
    (200, '{"result": [[{"document": {"id": 1}}]]}', "unexpected reply.*contents"),
    (200, '{"answer": []}', "unexpected reply.*result"),
], ids=["http-400", "not-json", "result-not-a-list", "document-without-contents", "no-result"])
def test_client_errors_and_malformed_replies_fail_at_once(status, body, message):
    with ScriptedServer([(status, body)]).running() as server, client(server.url) as http:
        with pytest.raises(RetrievalError, match=message):
            http.retrieve(["q1"], 1)
    assert len(server.requests) == 1


def test_256_concurrent_requests_through_one_client_all_get_their_own_results(retrieval_server):
    retriever = TableRetriever()
    server = retrieval_server(retriever)
    with client(server.url) as http, ThreadPoolExecutor(256) as pool:
        answers = list(pool.map(lambda i: http.retrieve([f"q{i}"], 1), range(256)))
    assert [answer[0][0].id for answer in answers] == [f"p{i}" for i in range(256)]
    health = httpx.get(f"{server.base_url}/health").json()
    assert health["queries_served"] == 256 and health["queries_waiting"] == 0
    assert sorted(q for call in retriever.calls for q in call) == sorted(f"q{i}" for i in range(256))


async def test_retrieve_runs_from_asyncio_threads(retrieval_server):
    server = retrieval_server(TableRetriever())
    with client(server.url, batched=False) as http:
        answers = await asyncio.gather(*(asyncio.to_thread(http.retrieve, [f"q{i}", "none"], 2) for i in range(32)))
    assert [(a[0][1].id, a[1]) for a in answers] == [(f"p{i}b", []) for i in range(32)]


def test_make_retriever_http_reads_the_envs_retriever_options(retrieval_server):
    server = retrieval_server(TableRetriever())
    http = make_retriever("http", {"url": server.url, "timeout_s": 5, "retries": 1, "backoff_s": 0.1,
                                   "batched": False})
    assert isinstance(http, HttpRetriever)
    assert (http.url, http.timeout_s, http.retries, http.backoff_s, http.batched) == (server.url, 5.0, 1, 0.1, False)
    assert http.retrieve(["q4"], 1)[0][0].id == "p4"
    http.close()


@pytest.mark.parametrize(("options", "message"), [
    ({"url": "http://127.0.0.1:1/retrieve", "topk": 3}, "unknown http retriever option.*topk"),
    ({"url": "127.0.0.1:8000/retrieve"}, "must start with http"),
    ({"retries": -1}, "retries must not be negative"),
    ({"timeout_s": 0}, "timeout_s must be positive"),
], ids=["unknown-option", "no-scheme", "negative-retries", "zero-timeout"])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        HttpRetriever.from_options(options)
