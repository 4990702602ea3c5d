"""The registry that names retrievers (the protocol they implement and the passages they return are in
:mod:`.retriever_types`, re-exported here).

A retriever answers a batch of queries with ranked passages::

    retriever.retrieve(["who founded x", "capital of y"], topk=3) -> [[Passage, ...], [Passage, ...]]

Built-in names: ``bm25`` (in-process, bm25s), ``dense`` (optional extra: embeddings + FAISS) and
``http`` (a client of a retrieval server). Third parties add their own with
:func:`register_retriever`, or with an entry point in the group ``skyrl_search.retrievers``
(``name = "module:factory"``); a factory takes the ``retriever`` config mapping and returns a
retriever.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from .retriever_types import Passage, RetrievalError, Retriever, RetrieverFactory

__all__ = ["ENTRY_POINT_GROUP", "Passage", "RetrievalError", "Retriever", "RetrieverFactory", "make_retriever",
           "register_retriever", "retriever_names"]

ENTRY_POINT_GROUP = "skyrl_search.retrievers"


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
