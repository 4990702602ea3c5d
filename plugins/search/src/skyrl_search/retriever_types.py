"""What every retriever shares: the :class:`Retriever` protocol, the :class:`Passage` it returns and the
:class:`RetrievalError` it raises. A leaf module: the backends (bm25, dense, http) and the registry in
:mod:`.retrieval` import it, it imports none of them.

A retriever answers a batch of queries with ranked passages::

    retriever.retrieve(["who founded x", "capital of y"], topk=3) -> [[Passage, ...], [Passage, ...]]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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
