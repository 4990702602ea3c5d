"""Dense retrieval (extra ``[dense]``): a sentence-embedding model and a FAISS inner-product index.

Texts are embedded e5-style: a prefix (``query: `` / ``passage: ``), the model's last hidden
states mean-pooled over real tokens, L2-normalised, so inner product is cosine similarity. The
model is a Hugging Face folder (``AutoModel`` + ``AutoTokenizer``) on local disk; nothing is
downloaded here. An index folder holds ``faiss.index`` (a flat inner-product index), the
passages (:class:`~skyrl_search.corpus.PassageStore`) and ``manifest.json``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from skyrl_core.notice import announce_slow_step, quiet_progress_bars
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

FORMAT = IndexFormat("skyrl-search-dense", 1, "dense",
                     "DenseRetriever.build_index(corpus, index_dir, model) or the dense option 'corpus'")
INDEX_FILE = "faiss.index"
OPTIONS = ("model", "index_dir", "corpus", "query_prefix", "passage_prefix", "max_length", "batch_size", "device",
           "progress")


def _require_dense() -> tuple[Any, Any, Any]:
    """``(faiss, torch, transformers)``, or ImportError naming the extra."""
    try:
        import faiss
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(f"dense retrieval needs faiss, torch and transformers ({error.name} is missing): "
                          "pip install 'skyrl-search[dense]'") from error
    return faiss, torch, transformers


class Encoder:
    """A sentence-embedding model from a local folder: mean-pooled, L2-normalised float32 vectors."""

    def __init__(self, model: str | os.PathLike[str], *, device: str | None = None, max_length: int = 256) -> None:
        _, torch, transformers = _require_dense()
        if not Path(model).is_dir():
            raise FileNotFoundError(f"embedding model folder {model} does not exist (dense retrieval loads a local "
                                    "Hugging Face model folder, e.g. one saved from intfloat/e5-base-v2)")
        self.path = str(Path(model).absolute())
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        with quiet_progress_bars():  # a local folder loads in seconds; transformers' bar would land in our output
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(model)
            self.model = transformers.AutoModel.from_pretrained(model).to(device=self.device, dtype=dtype).eval()
        self.max_length = min(max_length, getattr(self.model.config, "max_position_embeddings", max_length))
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch

    def encode(self, texts: Sequence[str], *, prefix: str = "", batch_size: int = 64) -> np.ndarray:
        """``(len(texts), dim)`` unit vectors of ``prefix + text``."""
        torch = self._torch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = [prefix + t for t in texts[start:start + batch_size]]
            enc = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            out[start:start + len(batch)] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
        return out


class DenseRetriever:
    """Embedding search over a saved FAISS index; ``retrieve`` embeds all queries of a batch at once."""

    def __init__(self, index_dir: Path, index: Any, passages: PassageStore, encoder: Encoder,
                 manifest: Mapping[str, Any], batch_size: int = 64) -> None:
        self.index_dir = index_dir
        self.manifest = dict(manifest)
        self.encoder = encoder
        self.index = index
        self.batch_size = batch_size
        self._passages = passages

    def __len__(self) -> int:
        return len(self._passages)

    def __repr__(self) -> str:
        return f"DenseRetriever({str(self.index_dir)!r}, model={self.encoder.path!r}, passages={len(self)})"

    def __reduce__(self) -> tuple[Any, tuple[Path, str, str, int]]:
        """Pickled as its folder and settings: another process loads (and shares) the index from there."""
        return _shared, (self.index_dir, self.encoder.path, self.encoder.device, self.batch_size)

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], *, model: str | os.PathLike[str] | None = None,
             mmap: bool = True, device: str | None = None, batch_size: int = 64) -> DenseRetriever:
        """The index in ``index_dir`` with the model it was built with (or ``model``); memory-mapped by default."""
        index_dir = Path(index_dir).absolute()
        manifest = FORMAT.read(index_dir)
        encoder = Encoder(model or manifest["model"], device=device, max_length=manifest["max_length"])
        return cls._open(index_dir, manifest, encoder, mmap=mmap, batch_size=batch_size)

    @classmethod
    def _open(cls, index_dir: Path, manifest: Mapping[str, Any], encoder: Encoder, *, mmap: bool,
              batch_size: int) -> DenseRetriever:
        faiss, _, _ = _require_dense()
        flags = (getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY) if mmap else 0
        index = faiss.read_index(str(index_dir / INDEX_FILE), flags)
        if encoder.dim != index.d:
            raise ValueError(f"the model {manifest['model']} embeds into {encoder.dim} dimensions but the "
                             f"index in {index_dir} holds {index.d}-dimensional vectors")
        return cls(index_dir, index, PassageStore(index_dir), encoder, manifest, batch_size)

    @classmethod
    def build_index(cls, corpus_path: str | os.PathLike[str], index_dir: str | os.PathLike[str],
                    model: str | os.PathLike[str], *, query_prefix: str = "query: ", passage_prefix: str = "passage: ",
                    max_length: int = 256, batch_size: int = 64, device: str | None = None,
                    progress: bool = True) -> DenseRetriever:
        """Embed every passage of the corpus file with ``model`` into ``index_dir`` (replacing an older index)."""
        settings = _settings(model, query_prefix, passage_prefix, max_length)
        identity = {**corpus_fingerprint(corpus_path), **settings}
        encoder = Encoder(model, device=device, max_length=max_length)
        manifest: dict[str, Any] = {}

        def build(tmp: Path) -> dict[str, Any]:
            manifest.update(_build(corpus_path, tmp, encoder, identity, batch_size, progress))
            return manifest

        folder = build_once(index_dir, lambda current: False, build)
        return cls._open(folder, manifest, encoder, mmap=True, batch_size=batch_size)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> DenseRetriever:
        """``make_retriever("dense", options)``: ``model`` (a local folder), ``index_dir`` and/or ``corpus``.

        Only ``index_dir``: load it (with the model recorded in it unless ``model`` is given). Otherwise
        ``model`` is required and the corpus (default: the built-in one) is embedded into ``index_dir``
        (default: the cache) unless the index there is current. Loaded indexes are shared by the process.
        """
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ValueError(f"unknown dense retriever options {sorted(unknown)}; known: {', '.join(OPTIONS)}")
        model, corpus, index_dir = options.get("model"), options.get("corpus"), options.get("index_dir")
        device, batch_size = options.get("device"), int(options.get("batch_size", 64))
        if corpus is None and index_dir is not None:
            return _shared(Path(index_dir), model and str(model), device, batch_size)
        if model is None:
            raise ValueError("the dense retriever needs 'model', a local embedding-model folder (e.g. one saved from "
                             "intfloat/e5-base-v2), to index a corpus; or 'index_dir' of an index built before")
        settings = _settings(model, options.get("query_prefix", "query: "), options.get("passage_prefix", "passage: "),
                             int(options.get("max_length", 256)))
        corpus_path, corpus_identity, key = resolve_corpus(corpus)
        identity = {**corpus_identity, **settings}
        model_key = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:8]

        def build(tmp: Path) -> dict[str, Any]:
            encoder = Encoder(model, device=device, max_length=settings["max_length"])
            return _build(corpus_path, tmp, encoder, identity, batch_size, bool(options.get("progress", False)))

        folder = build_once(index_dir or cache_root() / f"dense-{key}-{model_key}",
                            lambda manifest: FORMAT.is_current(manifest, identity), build)
        return _shared(folder, None, device, batch_size)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The ``topk`` passages nearest to each query (an empty query gets none), best first."""
        check_request(queries, topk)
        results: list[list[Passage]] = [[] for _ in queries]
        asked = [i for i, q in enumerate(queries) if q.strip()]
        if not asked:
            return results
        vectors = self.encoder.encode([queries[i] for i in asked], prefix=self.manifest["query_prefix"],
                                      batch_size=self.batch_size)
        scores, docs = self.index.search(vectors, min(topk, self.index.ntotal))
        for row, i in enumerate(asked):
            for doc, score in zip(docs[row], scores[row], strict=True):
                if doc >= 0:
                    p = self._passages[int(doc)]
                    results[i].append(Passage(id=p.id, title=p.title, text=p.text, score=float(score)))
        return results


def _settings(model: str | os.PathLike[str], query_prefix: str, passage_prefix: str, max_length: int) -> dict[str, Any]:
    """The embedding settings an index is built with (they go into its manifest)."""
    return {"model": str(Path(model).absolute()), "query_prefix": query_prefix, "passage_prefix": passage_prefix,
            "max_length": max_length}


def _shared(index_dir: Path, model: str | None, device: str | None, batch_size: int) -> DenseRetriever:
    """The process-wide loaded index of ``index_dir`` (loaded again only once the folder is rebuilt)."""
    folder = index_dir.absolute()
    return _load_shared(str(folder), manifest_stamp(folder), model, device, batch_size)


@functools.lru_cache(maxsize=4)
def _load_shared(index_dir: str, manifest_mtime_ns: int, model: str | None, device: str | None,
                 batch_size: int) -> DenseRetriever:
    return DenseRetriever.load(index_dir, model=model, device=device, batch_size=batch_size)


def _build(corpus_path: str | os.PathLike[str], folder: Path, encoder: Encoder, identity: Mapping[str, Any],
           batch_size: int, progress: bool) -> dict[str, Any]:
    """Embed the corpus into ``folder`` batch by batch; returns its manifest.

    Once the first batch is embedded, a build expected to take more than a few seconds says so on one
    line with its expected time (the first batch's time per byte of text, times the corpus file's size).
    """
    faiss, _, _ = _require_dense()
    index = faiss.IndexFlatIP(encoder.dim)
    size = Path(corpus_path).stat().st_size
    started = time.monotonic()

    def embedded() -> Iterator[Passage]:
        batch: list[Passage] = []
        first = True
        for p in tqdm(read_corpus(corpus_path), desc=f"Embedding {Path(corpus_path).name}", unit=" passages",
                      disable=not progress):
            batch.append(p)
            if len(batch) == batch_size:
                yield from add(batch)
                if first:
                    first = False
                    done = sum(len(q.contents.encode()) for q in batch) or 1
                    announce_slow_step(f"embedding {Path(corpus_path).name} ({size / 1e6:,.1f} MB) with "
                                       f"{Path(identity['model']).name}; done once, later runs load the saved index",
                                       (time.monotonic() - started) * size / done, source="skyrl-search")
                batch = []
        yield from add(batch)

    def add(batch: list[Passage]) -> list[Passage]:
        if batch:
            index.add(encoder.encode([p.contents for p in batch], prefix=identity["passage_prefix"],
                                     batch_size=batch_size))
        return batch

    count = PassageStore.write(embedded(), folder)
    if count == 0:
        raise ValueError(f"corpus file {corpus_path} holds no passages")
    faiss.write_index(index, str(folder / INDEX_FILE))
    return {**FORMAT.header(), **identity, "passages": count, "dim": encoder.dim,
            "pooling": "mean", "normalized": True, "faiss_version": faiss.__version__}
