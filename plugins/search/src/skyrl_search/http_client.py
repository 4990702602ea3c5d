"""``HttpRetriever``: a client of a Search-R1-style retrieval server (``skyrl-search serve`` or a peer's).

It sends the batched form ``{"queries": [...], "topk", "return_scores": true}`` (one request per
batch; the only form Search-R1's retrieval server takes), or with ``batched=False`` one single-form
``{"query": ...}`` request per query, sent concurrently (the only form SkyRL's example retrieval
server takes). ``skyrl-search serve`` takes both. Both response shapes (``{"document": doc, "score":
s}`` and the bare doc) become :class:`Passage` objects.

Server errors (5xx), refused connections and timeouts are retried ``retries`` times with
exponential backoff; a 4xx or a malformed reply fails at once. Every failure is a
:class:`RetrievalError` naming the URL. One instance is safe to share between threads (its
``httpx.Client`` pools connections), so an env may call ``retrieve`` via ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from .retriever_types import Passage, RetrievalError

DEFAULT_URL = "http://127.0.0.1:8000/retrieve"
_EXCERPT_CHARS = 300
_OPTIONS = ("url", "timeout_s", "retries", "backoff_s", "batched", "max_connections")
# A 422 that names the other form's field: the server takes only that form.
_OTHER_FORM_HINTS = {
    "query": " (this server takes only the single form {\"query\": ...}, as SkyRL's example retrieval server does: "
             "set the option batched: false)",
    "queries": " (this server takes only the batched form {\"queries\": [...]}, as Search-R1's retrieval server "
               "does: set the option batched: true, the default)",
}


class _Retryable(Exception):
    """A failure worth another attempt (5xx, connection error, timeout)."""


class HttpRetriever:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        batched: bool = True,
        max_connections: int = 256,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval url must start with http:// or https://, got {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must not be negative, got {retries}")
        if backoff_s < 0:
            raise ValueError(f"backoff_s must not be negative, got {backoff_s}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.url = url
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.batched = bool(batched)
        self.max_connections = int(max_connections)
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections),
            headers={"Accept": "application/json"},
        )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> HttpRetriever:
        """Build from the env's ``retriever_options`` (url, timeout_s, retries, backoff_s, batched, max_connections)."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"unknown http retriever option(s) {', '.join(unknown)}; known: {', '.join(_OPTIONS)}")
        return cls(**dict(options))

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` best passages for each query, from the server; RetrievalError on failure."""
        queries = list(queries)
        if not queries:
            return []
        if self.batched:
            return self._request({"queries": queries, "topk": topk, "return_scores": True}, len(queries))
        if len(queries) == 1:
            return self._request({"query": queries[0], "topk": topk, "return_scores": True}, 1)
        with ThreadPoolExecutor(max_workers=min(len(queries), self.max_connections)) as pool:
            answers = pool.map(lambda q: self._request({"query": q, "topk": topk, "return_scores": True}, 1), queries)
            return [answer[0] for answer in answers]

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HttpRetriever(url={self.url!r}, batched={self.batched})"

    def _request(self, body: dict[str, Any], expected: int) -> list[list[Passage]]:
        attempts = self.retries + 1
        last_error = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._attempt(body, expected)
            except _Retryable as exc:
                last_error = str(exc)
        raise RetrievalError(f"retrieval server {self.url} failed after {attempts} attempt(s); last error: {last_error}")

    def _attempt(self, body: dict[str, Any], expected: int) -> list[list[Passage]]:
        try:
            response = self._client.post(self.url, json=body)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timeout: no answer within {self.timeout_s:g} s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc or 'connection failed'}") from exc
        if response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}: {_excerpt(response.text)}")
        if response.status_code >= 400:
            other_form = "query" if "queries" in body else "queries"
            named = response.status_code == 422 and f'"{other_form}"' in response.text
            hint = _OTHER_FORM_HINTS[other_form] if named else ""
            raise RetrievalError(
                f"retrieval server {self.url} refused the request: HTTP {response.status_code}: "
                f"{_excerpt(response.text)}{hint}")
        try:
            payload = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RetrievalError(
                f"retrieval server {self.url} sent malformed JSON ({exc}): {_excerpt(response.text)}") from exc
        try:
            return _parse_result(payload, expected)
        except (KeyError, TypeError, ValueError) as exc:
            raise RetrievalError(
                f"retrieval server {self.url} sent an unexpected reply ({exc}): {_excerpt(response.text)}") from exc


def _parse_result(payload: Any, expected: int) -> list[list[Passage]]:
    result = payload["result"]
    if not isinstance(result, list) or len(result) != expected:
        got = len(result) if isinstance(result, list) else type(result).__name__
        raise ValueError(f"expected 'result' to hold {expected} result list(s), got {got}")
    return [[_passage(hit) for hit in hits] for hits in result]


def _passage(hit: Any) -> Passage:
    """A ``{"document": doc, "score": s}`` hit or a bare doc, as a Passage."""
    if not isinstance(hit, Mapping):
        raise ValueError(f"a hit must be an object, got {type(hit).__name__}")
    if "document" in hit:
        document, score = hit["document"], float(hit.get("score", 0.0))
    else:
        document, score = hit, 0.0
    if not isinstance(document, Mapping):
        raise ValueError(f"a document must be an object, got {type(document).__name__}")
    if "title" in document and "text" in document:
        title, text = str(document["title"]), str(document["text"])
    else:
        title, text = _split_contents(str(document["contents"]))
    return Passage(id=str(document.get("id", "")), title=title, text=text, score=score)


def _split_contents(contents: str) -> tuple[str, str]:
    """wiki-18's ``"Title"\\ntext`` into (title, text); contents without a title line are all text."""
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents
    return first.strip().strip('"'), rest


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"
