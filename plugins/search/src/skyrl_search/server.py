"""The retrieval server: Search-R1's HTTP API over any retriever, batching concurrent requests.

``POST /retrieve`` takes Search-R1's single form ``{"query": str, "topk": int?, "return_scores": bool}``
(one inner result list) or the batched form ``{"queries": [str, ...], ...}`` (one inner list per
query). With ``return_scores`` each hit is ``{"document": doc, "score": float}``, else the bare doc; a
doc has ``id``, ``contents`` (``"Title"\\ntext``), ``title`` and ``text``. ``GET /health`` says the
server is up, which retriever answers over how many passages, how many retrieval calls served how
many queries, and how many queries wait for the retriever.

Requests that arrive together are answered by one ``retriever.retrieve`` call: a single worker
task takes the first waiting request, waits ``batch_wait_ms`` for company when others are already
queued (a lone request is answered at once), and retrieves up to
``max_batch`` queries at once in a thread (at the largest topk asked; each request gets the first
topk of its list), so hundreds of concurrent rollouts cost a few calls. When a batch fails, its
requests are retried one by one, so that one bad query fails only its own request.

Needs the ``server`` extra: ``pip install 'skyrl-search[server]'``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .retrieval import Passage, RetrievalError, Retriever, make_retriever

MAX_QUERY_CHARS = 2000

Query = Annotated[str, Field(max_length=MAX_QUERY_CHARS)]


class RetrieveRequest(BaseModel):
    """Exactly one of ``query`` (Search-R1's single form) and ``queries`` (the batched form)."""

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
    queries: list[str]
    topk: int
    future: asyncio.Future[list[list[Passage]]]


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
            # Wait for company only under load (others already queued): a lone request is answered at once.
            if self.batch_wait_s > 0 and not self.queue.empty() and len(first.queries) + self.queue.qsize() < self.max_batch:
                await asyncio.sleep(self.batch_wait_s)
            batch, size = [first], len(first.queries)
            while size < self.max_batch and not self.queue.empty():
                item = self.queue.get_nowait()
                if size + len(item.queries) > self.max_batch:
                    carried = item
                    break
                batch.append(item)
                size += len(item.queries)
            self.queries_waiting -= size
            await self._answer(batch)

    async def _answer(self, items: list[_Pending]) -> None:
        """One retrieval call at the largest topk asked; each request gets its own topk's prefix."""
        items = [item for item in items if not item.future.done()]  # a client that went away cancels its future
        if not items:
            return
        queries = [q for item in items for q in item.queries]
        self.retrieve_calls += 1
        try:
            results = await asyncio.to_thread(self.retriever.retrieve, queries, max(item.topk for item in items))
            if len(results) != len(queries):
                raise RetrievalError(f"the retriever answered {len(results)} result lists for {len(queries)} queries")
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the waiting clients
            if len(items) > 1:  # retry each request alone, so that one bad query fails only its own request
                for item in items:
                    await self._answer([item])
            elif not items[0].future.done():
                items[0].future.set_exception(exc)
            return
        self.queries_served += len(queries)
        start = 0
        for item in items:
            end = start + len(item.queries)
            if not item.future.done():
                item.future.set_result([list(hits[:item.topk]) for hits in results[start:end]])
            start = end

def _hit(passage: Passage, return_scores: bool) -> dict[str, Any]:
    document = passage.as_document()
    return {"document": document, "score": passage.score} if return_scores else document


def create_app(
    retriever: Retriever,
    *,
    default_topk: int = 3,
    max_batch: int = 64,
    batch_wait_ms: float = 2.0,
    name: str | None = None,
) -> FastAPI:
    """A FastAPI app serving ``retriever`` with Search-R1's API; ``name`` shows in ``/health``."""
    if default_topk < 1:
        raise ValueError(f"default_topk must be at least 1, got {default_topk}")
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

    @app.post("/retrieve")
    async def retrieve(request: RetrieveRequest) -> dict[str, list[list[Any]]]:
        assert batcher is not None, "the app's lifespan starts the batcher"
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
    max_batch: int = 64,
    batch_wait_ms: float = 2.0,
) -> None:
    """Run the retrieval server in the foreground (loopback unless ``host`` says otherwise).

    ``retriever`` is a registered retriever name built from ``options`` (plus ``index_dir`` when
    given); with neither, bm25 uses the built-in corpus's index, built on first use.
    """
    retriever_options = dict(options or {})
    if index_dir is not None:
        retriever_options["index_dir"] = str(index_dir)
    backend = make_retriever(retriever, retriever_options)
    app = create_app(backend, default_topk=topk, max_batch=max_batch, batch_wait_ms=batch_wait_ms, name=retriever)
    uvicorn.run(app, host=host, port=port, log_level="info")


__all__ = ["MAX_QUERY_CHARS", "RetrieveRequest", "create_app", "running_server", "serve"]

