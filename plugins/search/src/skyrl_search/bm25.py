"""In-process BM25 retrieval on the ``bm25s`` library, with an index folder built once and memory-mapped.

An index folder holds the bm25s index (``*.index.npy``, ``vocab.index.json``, ``params.index.json``),
the passages (:class:`~skyrl_search.corpus.PassageStore`) and ``manifest.json`` (the corpus it was
built from, the passage count, the bm25s version, the tokenisation, a format version).

Passages are indexed as ``title + text``, lower-cased, split on words, English stopwords removed and,
when PyStemmer is installed, stemmed with the English Snowball stemmer (queries get the same
treatment; an index records whether it was stemmed and refuses to load without PyStemmer if so).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import bm25s
from skyrl_core.notice import announce_slow_step
from tqdm.auto import tqdm

from .corpus import (
    IndexFormat,
    PassageStore,
    build_once,
    check_request,
    corpus_fingerprint,
    manifest_stamp,
    read_corpus,
    resolve_corpus,
)
from .data import cache_root
from .retriever_types import Passage

FORMAT = IndexFormat("skyrl-search-bm25", 1, "BM25",
                     "BM25Retriever.build_index(corpus, index_dir) or the bm25 option 'corpus'")
STOPWORDS = "en"
INDEX_BYTES_PER_S = 4e6
"""Corpus bytes indexed per second (4.7 MB/s measured on 2 shared CPU cores): the build's expected time."""


def _stemmer(language: str | None) -> Any:
    """PyStemmer's stemmer for ``language`` (None: no stemming)."""
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError as error:
        raise ImportError(f"this index was built with the {language} stemmer of PyStemmer: pip install PyStemmer") \
            from error
    return Stemmer.Stemmer(language)


def _default_stem_language() -> str | None:
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        return None
    return "english"


class BM25Retriever:
    """BM25 over a saved index folder; ``retrieve`` answers a batch of queries at once."""

    def __init__(self, index_dir: Path, model: bm25s.BM25, passages: PassageStore, manifest: Mapping[str, Any]) -> None:
        self.index_dir = index_dir
        self.manifest = dict(manifest)
        self._model = model
        self._passages = passages
        self._stemmer = _stemmer(manifest.get("stemmer"))

    def __len__(self) -> int:
        return len(self._passages)

    def __repr__(self) -> str:
        return f"BM25Retriever({str(self.index_dir)!r}, passages={len(self)})"

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        """Pickled as its folder: another process loads (and shares) the index from there."""
        return _shared, (self.index_dir,)

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], mmap: bool = True) -> BM25Retriever:
        """The index saved in ``index_dir`` (memory-mapped unless ``mmap=False``); ``FileNotFoundError`` if none."""
        index_dir = Path(index_dir).absolute()
        manifest = FORMAT.read(index_dir)
        model = bm25s.BM25.load(index_dir, mmap=mmap, show_progress=False)
        return cls(index_dir, model, PassageStore(index_dir), manifest)

    @classmethod
    def build_index(cls, corpus_path: str | os.PathLike[str], index_dir: str | os.PathLike[str], *,
                    progress: bool = True) -> BM25Retriever:
        """Index the corpus file into ``index_dir`` (replacing an older index there) and load it."""
        fingerprint = corpus_fingerprint(corpus_path)
        folder = build_once(index_dir, lambda manifest: False,
                            lambda tmp: _build(corpus_path, tmp, fingerprint, progress=progress))
        return cls.load(folder)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> BM25Retriever:
        """``make_retriever("bm25", options)``: ``index_dir`` and/or ``corpus``; neither: the built-in corpus.

        With ``corpus``, the index in ``index_dir`` (default: the cache) is built unless it is already
        current for that file; with only ``index_dir`` it is loaded. Loaded indexes are shared by the process.
        """
        unknown = set(options) - {"index_dir", "corpus", "progress"}
        if unknown:
            raise ValueError(f"unknown bm25 retriever options {sorted(unknown)}; known: corpus, index_dir, progress")
        corpus, index_dir = options.get("corpus"), options.get("index_dir")
        progress = bool(options.get("progress", False))  # an env's build never draws into a command's output
        if corpus is None and index_dir is not None:
            return _shared(Path(index_dir))
        corpus_path, identity, key = resolve_corpus(corpus)
        folder = build_once(index_dir or cache_root() / f"bm25-{key}",
                            lambda manifest: FORMAT.is_current(manifest, identity),
                            lambda tmp: _build(corpus_path, tmp, identity, progress=progress))
        return _shared(folder)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` best-scoring passages per query (fewer when fewer passages share a word with it)."""
        check_request(queries, topk)
        vocab = self._model.vocab_dict
        token_lists = bm25s.tokenize(list(queries), stopwords=STOPWORDS, stemmer=self._stemmer,
                                     return_ids=False, show_progress=False)
        query_ids = [[vocab[t] for t in tokens if t and t in vocab] for tokens in token_lists]
        asked = [i for i, ids in enumerate(query_ids) if ids]
        results: list[list[Passage]] = [[] for _ in queries]
        if not asked:
            return results
        k = min(topk, len(self._passages))
        docs, scores = self._model.retrieve([query_ids[i] for i in asked], k=k, show_progress=False)
        for row, i in enumerate(asked):
            for doc, score in zip(docs[row], scores[row], strict=True):
                if score > 0:  # a zero score shares no word with the query
                    p = self._passages[int(doc)]
                    results[i].append(Passage(id=p.id, title=p.title, text=p.text, score=float(score)))
        return results


def _shared(index_dir: Path) -> BM25Retriever:
    """The process-wide loaded index of ``index_dir`` (loaded again only once the folder is rebuilt)."""
    folder = index_dir.absolute()
    return _load_shared(str(folder), manifest_stamp(folder))


@functools.lru_cache(maxsize=8)
def _load_shared(index_dir: str, manifest_mtime_ns: int) -> BM25Retriever:
    return BM25Retriever.load(index_dir)


def _build(corpus_path: str | os.PathLike[str], folder: Path, identity: Mapping[str, Any], *,
           progress: bool) -> dict[str, Any]:
    """Tokenise and index the corpus into ``folder``; returns its manifest.

    A build expected to take more than a few seconds says so first, on one line with its expected
    time; ``progress`` adds our own bar over the passages (bm25s' bars stay off either way).
    """
    size = Path(corpus_path).stat().st_size
    announce_slow_step(f"indexing {Path(corpus_path).name} ({size / 1e6:,.1f} MB) for BM25; done once, later "
                       "runs load the saved index", size / INDEX_BYTES_PER_S, source="skyrl-search")
    language = _default_stem_language()
    tokenizer = bm25s.tokenization.Tokenizer(stopwords=STOPWORDS, stemmer=_stemmer(language))
    token_ids: list[list[int]] = []

    def tokenised() -> Iterator[Passage]:
        for p in tqdm(read_corpus(corpus_path), desc=f"Indexing {Path(corpus_path).name}", unit=" passages",
                      disable=not progress):
            token_ids.extend(tokenizer.streaming_tokenize([f"{p.title}\n{p.text}"], update_vocab=True))
            yield p

    count = PassageStore.write(tokenised(), folder)
    if count == 0:
        raise ValueError(f"corpus file {corpus_path} holds no passages")
    model = bm25s.BM25()
    model.index(tokenizer.to_tokenized_tuple(token_ids), show_progress=False)
    model.save(folder, show_progress=False)
    return {**FORMAT.header(), **identity, "passages": count,
            "bm25s_version": bm25s.__version__, "stopwords": STOPWORDS, "stemmer": language}
