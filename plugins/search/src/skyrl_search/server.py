"""The retrieval server: Search-R1's HTTP API over any retriever, batching concurrent requests.

``POST /retrieve`` takes the single form ``{"query": str, "topk": int?, "return_scores": bool}``
(one inner result list; what SkyRL's example retrieval server takes) or the batched form
``{"queries": [str, ...], ...}`` (one inner list per query; what Search-R1's retrieval server
takes). With ``return_scores`` each hit is ``{"document": doc, "score": float}``, else the bare doc;
a doc has ``id``, ``contents`` (``"Title"\\ntext``), ``title`` and ``text``. ``GET /health`` says the
server is up, which retriever answers over how many passages, how many retrieval calls served how
many queries, and how many queries wait for the retriever.

A request may ask for at most ``max_topk`` passages per query and hold at most ``max_queries``
queries (422 above either, naming the cap). A refused request's error never repeats its input.

Requests that arrive together are answered by one ``retriever.retrieve`` call: a single worker
task takes the first waiting request, waits ``batch_wait_ms`` for company when others are already
queued (a lone request is answered at once), and retrieves up to
``max_batch`` queries at once in a thread (at the largest topk asked; each request gets the first
topk of its list), so hundreds of concurrent rollouts cost a few calls. A request of more than
``max_batch`` queries is answered in parts: after each part it goes to the back of the line, so the
requests that arrived meanwhile are served before its next part. When a batch fails, its requests
are retried one by one, so that one bad query fails only its own request.

Needs the ``server`` extra: ``pip install 'skyrl-search[server]'``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from skyrl_core.http_hygiene import HttpLimits, HygieneMiddleware, validation_errors

from .config import DEFAULT_MAX_QUERIES, DEFAULT_MAX_TOPK
from .retrieval import Passage, RetrievalError, Retriever, make_retriever

MAX_QUERY_CHARS = 2000

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


@dataclass
class _Pending:
    """One request; one of more than ``max_batch`` queries is handed to the retriever in parts."""

    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[Passage]]]
    taken: int = 0  # queries handed to the retriever so far
    results: list[list[Passage]] = field(default_factory=list)  # the answers so far, in query order

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
    queue: asyncio.Queue[_Pending] = field(default_factory=asyncio.Queue)
    retrieve_calls: int = 0
    queries_served: int = 0
    queries_waiting: int = 0

    async def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        future: asyncio.Future[list[list[Passage]]] = asyncio.get_running_loop().create_future()
        self.queries_waiting += len(queries)
        self.queue.put_nowait(_Pending(queries, topk, future))
        return await future

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
                room = self.max_batch - size
                if item.left > room and len(item.queries) <= self.max_batch:  # a request that fits a call is never split
                    carried = item
                    break
                parts.append(item.take(room))
                size += len(parts[-1].queries)
            self.queries_waiting -= size
            await self._answer(parts)
            # The rest of a large request goes to the back of the line: requests that came meanwhile go first.
            for part in parts:
                if part.request.left and self._live(part.request):
                    self.queue.put_nowait(part.request)

    def _live(self, item: _Pending) -> bool:
        """Whether ``item`` still waits for answers; the queries left of one that failed or was cancelled are dropped."""
        if not item.future.done():
            return True
        self.queries_waiting -= item.left
        item.taken = len(item.queries)
        return False

    async def _answer(self, parts: list[_Part]) -> None:
        """One retrieval call at the largest topk asked; each request gets its own topk's prefix."""
        parts = [part for part in parts if not part.request.future.done()]  # a client that went away cancels its future
        if not parts:
            return
        queries = [q for part in parts for q in part.queries]
        self.retrieve_calls += 1
        try:
            results = await asyncio.to_thread(self.retriever.retrieve, queries, max(p.request.topk for p in parts))
            if len(results) != len(queries):
                raise RetrievalError(f"the retriever answered {len(results)} result lists for {len(queries)} queries")
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


def _hit(passage: Passage, return_scores: bool) -> dict[str, Any]:
    document = passage.as_document()
    return {"document": document, "score": passage.score} if return_scores else document


def _check_caps(request: RetrieveRequest, max_topk: int, max_queries: int) -> None:
    """Refuse a request above this server's caps as pydantic would (422), naming the cap."""
    errors = []
    if request.topk is not None and request.topk > max_topk:
        errors.append({"type": "less_than_equal", "loc": ("body", "topk"),
                       "msg": f"topk may be at most {max_topk} (this server's max_topk)"})
    if request.queries is not None and len(request.queries) > max_queries:
        errors.append({"type": "too_long", "loc": ("body", "queries"),
                       "msg": f"a request may hold at most {max_queries} queries (this server's max_queries)"})
    if errors:
        raise RequestValidationError(errors)


def http_limits(max_queries: int, allowed_hosts: Sequence[str] = ()) -> HttpLimits:
    """What a request may be before anything parses it: a body of ``max_queries`` queries of the longest
    length, each character escaped (6 bytes), plus room for the rest of the JSON."""
    return HttpLimits(max_body_bytes=max_queries * MAX_QUERY_CHARS * 6 + 64 * 1024, max_json_items=max_queries + 64,
                      allowed_hosts=tuple(allowed_hosts))


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_topk: int = DEFAULT_MAX_TOPK,
    max_queries: int = DEFAULT_MAX_QUERIES,
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
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    if batch_wait_ms < 0:
        raise ValueError(f"batch_wait_ms must not be negative, got {batch_wait_ms}")
    retriever_name = name or type(retriever).__name__
    batcher: _Batcher | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal batcher
        batcher = _Batcher(retriever, max_batch, batch_wait_ms / 1000)
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
    app.add_middleware(HygieneMiddleware, limits=http_limits(max_queries, allowed_hosts), bound_host=bound_host)

    @app.exception_handler(RequestValidationError)
    async def refuse(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_errors(exc.errors())}, status_code=422)

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> dict[str, list[list[Any]]]:
        assert batcher is not None, "the app's lifespan starts the batcher"
        _check_caps(request, max_topk, max_queries)
        queries = [request.query] if request.query is not None else list(request.queries or [])
        try:
            results = await batcher.submit(queries, request.topk or default_topk)
        except Exception as exc:  # noqa: BLE001 - the client gets the retriever's message
            raise HTTPException(status_code=500, detail=f"retrieval failed: {type(exc).__name__}: {exc}") from exc
        return {"result": [[_hit(p, request.return_scores) for p in hits] for hits in results]}

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
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
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
    app = create_app(backend, default_topk=topk, max_topk=max_topk, max_queries=max_queries, max_batch=max_batch,
                     batch_wait_ms=batch_wait_ms, name=retriever, allowed_hosts=allowed_hosts, bound_host=host)
    uvicorn.run(app, host=host, port=port, log_level="info")


__all__ = ["DEFAULT_MAX_QUERIES", "DEFAULT_MAX_TOPK", "MAX_QUERY_CHARS", "RetrieveRequest", "create_app",
           "running_server", "serve"]

