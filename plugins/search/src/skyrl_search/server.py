"""The retrieval server: Search-R1's HTTP API over any retriever, batching concurrent requests.

``POST /retrieve`` takes the single form ``{"query": str, "topk": int?, "return_scores": bool}``
(one inner result list; what SkyRL's example retrieval server takes) or the batched form
``{"queries": [str, ...], ...}`` (one inner list per query; what Search-R1's retrieval server
takes). With ``return_scores`` each hit is ``{"document": doc, "score": float}``, else the bare doc;
a doc has ``id``, ``contents`` (``"Title"\\ntext``), ``title`` and ``text``. ``GET /health`` says the
server is up, which retriever answers over how many passages, how many retrieval calls served how
many queries, and how many queries wait for the retriever.

A request may ask for at most ``max_topk`` passages per query, hold at most ``max_queries`` queries
and ask for at most ``max_passages`` passages in all (queries x topk): 422 above any of them, naming
the cap and the ``serve`` option that raises it. The defaults serve the peers' whole rollout batches
in one request (Search-R1's trainer sends every search of a 512-prompt x 5-sample GRPO batch, 2,560
queries, at once). A request that has used ``max_request_s`` of retrieval time (its share of each call
that answered part of it) with queries still unanswered is answered 413, and one whose client went
away is dropped, so neither keeps costing retrieval time. A refused request's error never repeats its
input.

Requests that arrive together are answered by one ``retriever.retrieve`` call: a single worker
task takes the first waiting request, waits ``batch_wait_ms`` for company when others are already
queued (a lone request is answered at once), and retrieves up to
``max_batch`` queries at once in a thread (at the largest topk asked; each request gets the first
topk of its list), so hundreds of concurrent rollouts cost a few calls. A request of more than
``max_batch`` queries is answered in parts: after each part it goes to the back of the line, so the
requests that arrived meanwhile are served before its next part, and in a call without it (only the
request at the head of the line is split; the others join a call whole): a one-query request waits
for at most one part of a large one. When a batch fails, its requests are retried one by one, so
that one bad query fails only its own request. A large request is parsed and its answer encoded in a
thread, so it does not hold up the other requests on the event loop.

Needs the ``server`` extra: ``pip install 'skyrl-search[server]'``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from skyrl_core.http_hygiene import HttpLimits, HygieneMiddleware, capped, load_json, validation_errors
from skyrl_core.http_serving import uvicorn_config

from .config import DEFAULT_MAX_PASSAGES, DEFAULT_MAX_QUERIES, DEFAULT_MAX_REQUEST_S, DEFAULT_MAX_TOPK
from .retrieval import Passage, RetrievalError, Retriever, make_retriever

MAX_QUERY_CHARS = 2000
# Body bytes per query the size limit allows: a query of the longest length, twice over (room for escapes).
QUERY_BYTES = 2 * MAX_QUERY_CHARS
_OFF_LOOP_PASSAGES = 1024  # an answer of this many passages is encoded in a thread
T = TypeVar("T")

Query = Annotated[str, Field(max_length=MAX_QUERY_CHARS)]


class RetrieveRequest(BaseModel):
    """Exactly one of ``query`` (the single form) and ``queries`` (the batched form)."""

    model_config = ConfigDict(extra="forbid")

    query: Query | None = None
    queries: Annotated[list[Query], Field(min_length=1)] | None = None
    topk: Annotated[int, Field(ge=1)] | None = None
    return_scores: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> RetrieveRequest:
        if (self.query is None) == (self.queries is None):
            raise ValueError("give exactly one of 'query' (a string) or 'queries' (a non-empty list of strings)")
        return self


@dataclass(frozen=True)
class _Caps:
    """What one request may ask for; each refusal names the cap and the ``serve`` option that raises it."""

    max_topk: int
    max_queries: int
    max_passages: int

    def check(self, request: RetrieveRequest, topk: int) -> None:
        """Refuse a request above the caps as pydantic would (422)."""
        count = 1 if request.queries is None else len(request.queries)
        errors = []
        if topk > self.max_topk:
            errors.append({"type": "less_than_equal", "loc": ("body", "topk"),
                           "msg": f"topk may be at most {self.max_topk} (this server's max_topk; "
                                  "skyrl-search serve --max-topk N raises it)"})
        if count > self.max_queries:
            errors.append({"type": "too_long", "loc": ("body", "queries"),
                           "msg": f"a request may hold at most {self.max_queries} queries (this server's max_queries; "
                                  "skyrl-search serve --max-queries N raises it)"})
        if count * topk > self.max_passages:
            errors.append({"type": "less_than_equal", "loc": ("body",),
                           "msg": f"a request may ask for at most {self.max_passages} passages in all, its queries x "
                                  f"topk ({count} x {topk} here; this server's max_passages: skyrl-search serve "
                                  "--max-passages N raises it)"})
        if errors:
            raise RequestValidationError(errors)


class _OverBudget(Exception):
    """A request still had queries to answer when its time budget ran out."""

    def __init__(self, answered: int, queries: int, budget_s: float) -> None:
        super().__init__(
            f"the request used this server's retrieval time budget of {budget_s:g} s per request with {answered} of "
            f"its {queries} queries answered (max_request_s; skyrl-search serve --max-request-s S raises it); send "
            "fewer queries per request")


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass
class _Pending:
    """One request; one of more than ``max_batch`` queries is handed to the retriever in parts."""

    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[Passage]]]
    taken: int = 0  # queries handed to the retriever so far
    results: list[list[Passage]] = field(default_factory=list)  # the answers so far, in query order
    spent_s: float = 0.0  # retrieval time used: its share of each call that held a part of it

    @property
    def left(self) -> int:
        return len(self.queries) - self.taken

    def take(self, count: int) -> _Part:
        part = _Part(self, self.taken, min(self.taken + count, len(self.queries)))
        self.taken = part.end
        return part


@dataclass
class _Part:
    """The queries ``start:end`` of a request, answered by one retrieval call."""

    request: _Pending
    start: int
    end: int

    @property
    def queries(self) -> list[str]:
        return self.request.queries[self.start:self.end]

    def answer(self, hits: list[list[Passage]]) -> None:
        request = self.request
        request.results.extend(list(found[:request.topk]) for found in hits)
        if len(request.results) == len(request.queries):
            request.future.set_result(request.results)


@dataclass
class _Batcher:
    """One worker task that answers queued requests with as few retrieval calls as it can."""

    retriever: Retriever
    max_batch: int
    batch_wait_s: float
    max_request_s: float
    queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    retrieve_calls: int = 0
    queries_served: int = 0
    queries_waiting: int = 0

    async def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        pending = _Pending(queries, topk, asyncio.get_running_loop().create_future())
        self.queries_waiting += len(queries)
        self.queue.put_nowait(pending)
        try:
            return await pending.future
        finally:
            if pending.future.cancelled():  # its client went away: its queries wait no more
                self._drop(pending)

    async def run(self) -> None:
        carried: _Pending | None = None
        while True:
            first = carried if carried is not None else await self.queue.get()
            carried = None
            if not self._live(first):
                continue
            # Wait for company only under load (others already queued): a lone request is answered at once.
            if self.batch_wait_s > 0 and not self.queue.empty() and first.left + self.queue.qsize() < self.max_batch:
                await asyncio.sleep(self.batch_wait_s)
            parts = [first.take(self.max_batch)]
            size = len(parts[0].queries)
            while size < self.max_batch and not self.queue.empty():
                item = self.queue.get_nowait()
                if not self._live(item):
                    continue
                if item.left > self.max_batch - size:  # only the head of the line is split; the rest join whole
                    carried = item
                    break
                parts.append(item.take(item.left))
                size += len(parts[-1].queries)
            self.queries_waiting -= size
            await self._answer(parts)
            # The rest of a large request goes to the back of the line: requests that came meanwhile go first.
            for part in parts:
                if part.request.left and self._live(part.request):
                    self.queue.put_nowait(part.request)

    def _live(self, item: _Pending) -> bool:
        """Whether ``item`` still waits for answers; the queries left of one that failed, was cancelled or ran
        out of time are dropped."""
        if not item.future.done() and item.left and item.spent_s > self.max_request_s:
            item.future.set_exception(_OverBudget(item.taken, len(item.queries), self.max_request_s))
        if not item.future.done():
            return True
        self._drop(item)
        return False

    def _drop(self, item: _Pending) -> None:
        self.queries_waiting -= item.left
        item.taken = len(item.queries)

    async def _answer(self, parts: list[_Part]) -> None:
        """One retrieval call at the largest topk asked; each request gets its own topk's prefix."""
        parts = [part for part in parts if not part.request.future.done()]  # a client that went away cancels its future
        if not parts:
            return
        queries = [q for part in parts for q in part.queries]
        try:
            results = await self._retrieve(parts, queries)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the waiting clients
            if len(parts) > 1:  # retry each part alone, so that one bad query fails only its own request
                for part in parts:
                    await self._answer([part])
            elif not parts[0].request.future.done():
                parts[0].request.future.set_exception(exc)
            return
        self.queries_served += len(queries)
        start = 0
        for part in parts:
            end = start + len(part.queries)
            if not part.request.future.done():
                part.answer(results[start:end])
            start = end

    async def _retrieve(self, parts: list[_Part], queries: list[str]) -> list[list[Passage]]:
        """One retrieval call for ``parts`` (``queries``: theirs); each request is charged its share of its time."""
        self.retrieve_calls += 1
        started = time.monotonic()
        try:
            results = await asyncio.to_thread(self.retriever.retrieve, queries, max(p.request.topk for p in parts))
        finally:
            elapsed = time.monotonic() - started
            for part in parts:
                part.request.spent_s += elapsed * len(part.queries) / len(queries)
        if len(results) != len(queries):
            raise RetrievalError(f"the retriever answered {len(results)} result lists for {len(queries)} queries")
        return results


def _hit(passage: Passage, return_scores: bool) -> dict[str, Any]:
    document = passage.as_document()
    return {"document": document, "score": passage.score} if return_scores else document


def _encode(results: list[list[Passage]], return_scores: bool) -> bytes:
    """The answer as JSON bytes, as FastAPI would send it; built here so that a large one is built in a thread,
    one query's list at a time (one C call per list: the event loop's thread gets the GIL in between, and no
    text copy of the whole answer is made)."""
    lists = (json.dumps([_hit(p, return_scores) for p in hits], ensure_ascii=False, allow_nan=False,
                        separators=(",", ":")).encode() for hits in results)
    return b'{"result":[' + b",".join(lists) + b"]}"


async def _in_thread_if(large: bool, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)``, in a thread when ``large``: a long parse or encode must not hold up the event loop."""
    return await asyncio.to_thread(function, *args) if large else function(*args)


async def _parse(body: bytes, limits: HttpLimits) -> RetrieveRequest:
    """The request, parsed by core's :func:`~skyrl_core.http_hygiene.load_json` (in a thread when large), then
    validated; its errors as FastAPI gives them (422, under ``body``)."""
    try:
        return RetrieveRequest.model_validate(await load_json(body, limits))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in errors]) from None


async def _disconnected(receive: Callable[[], Awaitable[Mapping[str, Any]]]) -> None:
    """Returns once the client has gone away (called after the body is read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled and _ClientGone raised."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()  # a no-op once it is done
        gone.cancel()
    if task not in done:
        raise _ClientGone
    return task.result()


def http_limits(max_queries: int, allowed_hosts: Sequence[str] = ()) -> HttpLimits:
    """What a request may be before anything parses it: a body of ``max_queries`` queries of ``QUERY_BYTES``
    each plus room for the rest of the JSON, and twice as many JSON values as queries, so that a request of
    too many queries meets the 422 that names ``max_queries`` before the 400 on its values."""
    return HttpLimits(max_body_bytes=max_queries * QUERY_BYTES + 64 * 1024, max_json_items=2 * max_queries + 64,
                      allowed_hosts=tuple(allowed_hosts))


# /retrieve reads its body itself (to parse a large one in a thread); its schema still shows in /docs.
_REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": RetrieveRequest.model_json_schema()}}}}


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_topk: int = DEFAULT_MAX_TOPK,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_passages: int = DEFAULT_MAX_PASSAGES,
    max_request_s: float = DEFAULT_MAX_REQUEST_S,
    max_batch: int = 64,
    batch_wait_ms: float = 2.0,
    name: str | None = None,
    allowed_hosts: Sequence[str] = (),
    bound_host: str | None = None,
) -> FastAPI:
    """A FastAPI app serving ``retriever`` with Search-R1's API; ``name`` shows in ``/health``.

    Every request passes core's HTTP hygiene first (:mod:`skyrl_core.http_hygiene`): its ``Host`` must be a
    loopback name, ``bound_host`` or one of ``allowed_hosts``, and its body fits :func:`http_limits`.
    """
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be between 1 and max_topk ({max_topk}), got {default_topk}")
    if max_queries < 1:
        raise ValueError(f"max_queries must be at least 1, got {max_queries}")
    if max_passages < default_topk:
        raise ValueError(f"max_passages must be at least default_topk ({default_topk}), got {max_passages}")
    if not max_request_s > 0:  # NaN too
        raise ValueError(f"max_request_s must be positive, got {max_request_s}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    if batch_wait_ms < 0:
        raise ValueError(f"batch_wait_ms must not be negative, got {batch_wait_ms}")
    retriever_name = name or type(retriever).__name__
    caps = _Caps(max_topk, max_queries, max_passages)
    batcher: _Batcher | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal batcher
        batcher = _Batcher(retriever, max_batch, batch_wait_ms / 1000, max_request_s)
        worker = asyncio.create_task(batcher.run(), name="skyrl-search-batcher")
        try:
            yield
        finally:
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass

    app = FastAPI(title="skyrl-search retrieval server", lifespan=lifespan)
    limits = http_limits(max_queries, allowed_hosts)
    app.add_middleware(HygieneMiddleware, limits=limits, bound_host=bound_host)

    @app.exception_handler(RequestValidationError)
    async def refuse(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_errors(exc.errors())}, status_code=422)

    @app.post("/retrieve", openapi_extra=_REQUEST_BODY)
    async def retrieve(http: Request) -> Response:
        assert batcher is not None, "the app's lifespan starts the batcher"
        request = await _parse(await http.body(), limits)
        topk = request.topk or default_topk
        caps.check(request, topk)
        queries = [request.query] if request.query is not None else list(request.queries or [])
        try:
            results = await _unless_client_leaves(http, batcher.submit(queries, topk))
        except _ClientGone:
            return Response(status_code=499)  # nobody reads it; nginx's code for a client that closed the request
        except _OverBudget as exc:
            raise HTTPException(status_code=413, detail=str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - the client gets the retriever's message
            raise HTTPException(status_code=500, detail=capped(f"retrieval failed: {type(exc).__name__}: {exc}")) from exc
        body = await _in_thread_if(len(queries) * topk >= _OFF_LOOP_PASSAGES, _encode, results, request.return_scores)
        return Response(body, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        body: dict[str, Any] = {"status": "ok", "retriever": retriever_name}
        if hasattr(retriever, "__len__"):
            body["passages"] = len(retriever)  # type: ignore[arg-type]
        if batcher is not None:
            body["retrieve_calls"] = batcher.retrieve_calls
            body["queries_served"] = batcher.queries_served
            body["queries_waiting"] = batcher.queries_waiting
        return body

    return app


@contextmanager
def running_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` in a background thread; yields its ``http://host:port`` and stops it on exit.

    ``port=0`` takes a free port. For notebooks and tests; ``serve`` is the foreground command.
    """
    # IPPROTO_TCP named, so that asyncio turns Nagle's algorithm off on each connection (it checks the protocol):
    # with it on, every keep-alive request after the first waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn_config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="skyrl-search-server", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the retrieval server on {host}:{sock.getsockname()[1]} failed to start")
            time.sleep(0.01)
        bound_port = sock.getsockname()[1]
        yield f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def serve(
    index_dir: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    topk: int = 3,
    retriever: str = "bm25",
    options: Mapping[str, Any] | None = None,
    *,
    max_topk: int = DEFAULT_MAX_TOPK,
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_passages: int = DEFAULT_MAX_PASSAGES,
    max_request_s: float = DEFAULT_MAX_REQUEST_S,
    max_batch: int = 64,
    batch_wait_ms: float = 2.0,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Run the retrieval server in the foreground (loopback unless ``host`` says otherwise; a client that
    reaches it by another name than the loopback ones and ``host`` needs that name in ``allowed_hosts``).

    ``retriever`` is a registered retriever name built from ``options`` (plus ``index_dir`` when
    given); with neither, bm25 uses the built-in corpus's index, built on first use.
    """
    retriever_options = dict(options or {})
    if index_dir is not None:
        retriever_options["index_dir"] = str(index_dir)
    backend = make_retriever(retriever, retriever_options)
    app = create_app(backend, default_topk=topk, max_topk=max_topk, max_queries=max_queries, max_passages=max_passages,
                     max_request_s=max_request_s, max_batch=max_batch, batch_wait_ms=batch_wait_ms, name=retriever,
                     allowed_hosts=allowed_hosts, bound_host=host)
    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level="info")).run()


__all__ = ["DEFAULT_MAX_PASSAGES", "DEFAULT_MAX_QUERIES", "DEFAULT_MAX_REQUEST_S", "DEFAULT_MAX_TOPK",
           "MAX_QUERY_CHARS", "QUERY_BYTES", "RetrieveRequest", "create_app", "http_limits", "running_server", "serve"]

