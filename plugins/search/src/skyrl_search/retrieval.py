"""The retriever protocol every backend implements, and the registry that names them.

A retriever answers a batch of queries with ranked passages::

    retriever.retrieve(["who founded x", "capital of y"], topk=3) -> [[Passage, ...], [Passage, ...]]

Built-in names: ``bm25`` (in-process, bm25s), ``dense`` (optional extra: embeddings + FAISS) and
``http`` (a client of a retrieval server). Third parties add their own with
:func:`register_retriever`, or with an entry point in the group ``skyrl_search.retrievers``
(``name = "module:factory"``); a factory takes the ``retriever`` config mapping and returns a
retriever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

ENTRY_POINT_GROUP = "skyrl_search.retrievers"


@dataclass(frozen=True)
class Passage:
    """One retrieved passage (``contents`` in the wiki-18 layout is ``"Title"\\ntext``)."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def as_document(self) -> dict[str, str]:
        """The document as Search-R1's retrieval server returns it."""
        return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` best passages for each query, best first (one list per query, in order)."""


class RetrievalError(RuntimeError):
    """Retrieval failed (server down, timeout, bad response); the message says what and where."""


RetrieverFactory = Callable[[Mapping[str, Any]], Retriever]
_factories: dict[str, RetrieverFactory] = {}


def register_retriever(name: str, factory: RetrieverFactory) -> None:
    """Make ``name`` usable as ``retriever.name`` in the env config."""
    _factories[name] = factory


def retriever_names() -> list[str]:
    _load_builtins()
    return sorted({*_factories, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def make_retriever(name: str, options: Mapping[str, Any] | None = None) -> Retriever:
    """The retriever registered as ``name``, built from ``options``; ValueError naming the known ones."""
    _load_builtins()
    factory = _factories.get(name)
    if factory is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == name:
                factory = ep.load()
                break
    if factory is None:
        raise ValueError(f"unknown retriever {name!r}; known: {', '.join(retriever_names())}")
    return factory(dict(options or {}))


def _load_builtins() -> None:
    if {"bm25", "http", "dense"} <= set(_factories):
        return

    def bm25(options: Mapping[str, Any]) -> Retriever:
        from .bm25 import BM25Retriever

        return BM25Retriever.from_options(options)

    def http(options: Mapping[str, Any]) -> Retriever:
        from .http_client import HttpRetriever

        return HttpRetriever.from_options(options)

    def dense(options: Mapping[str, Any]) -> Retriever:
        from .dense import DenseRetriever

        return DenseRetriever.from_options(options)

    _factories.setdefault("bm25", bm25)
    _factories.setdefault("http", http)
    _factories.setdefault("dense", dense)
