"""Corpora on disk: reading wiki-18-style JSONL/Parquet, writing JSONL, and the passage store of an index.

A corpus row is either Search-R1's wiki-18 layout, ``{"id": "0", "contents": "\\"Title\\"\\ntext"}``
(the first line, in double quotes, is the title; it may be missing), or explicit fields
``{"id": ..., "title": ..., "text": ...}``. Parquet files hold the same columns.

An index folder keeps its passages in a :class:`PassageStore` (``passages.jsonl`` plus a
memory-mapped array of line offsets), so a loaded index reads only the passages it returns.
Index folders are built once with :func:`build_once`: under a file lock, into a temporary folder
that is renamed into place. :func:`check_request` validates the arguments of ``retrieve``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .retriever_types import Passage

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "passages.offsets.npy"
MANIFEST_FILE = "manifest.json"


def read_corpus(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """The passages of a ``.jsonl`` (or ``.json`` lines) or ``.parquet`` corpus, in file order.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file and the
    line (JSONL, 1-based) or row (Parquet, 0-based) of a malformed row.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist")
    if path.suffix == ".parquet":
        yield from _read_parquet(path)
    else:
        yield from _read_jsonl(path)


def _read_jsonl(path: Path) -> Iterator[Passage]:
    with path.open("r", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {line_no}: not valid JSON ({error.msg})") from None
            yield _passage(row, default_id=str(line_no - 1), where=f"{path}, line {line_no}")


def _read_parquet(path: Path) -> Iterator[Passage]:
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"reading the Parquet corpus {path} needs pyarrow: pip install 'skyrl-search[parquet]'") \
            from error
    row_no = 0
    for batch in pq.ParquetFile(path).iter_batches():
        for row in batch.to_pylist():
            yield _passage(row, default_id=str(row_no), where=f"{path}, row {row_no}")
            row_no += 1


def _passage(row: Any, *, default_id: str, where: str) -> Passage:
    """One corpus row as a Passage; ``ValueError`` starting with ``where`` when the row is malformed."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a JSON object with 'contents' or 'title'/'text', got {type(row).__name__}")
    raw_id = row.get("id", default_id)
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
        raise ValueError(f"{where}: 'id' must be a string or an integer, got {raw_id!r}")
    if isinstance(row.get("text"), str):
        title = row.get("title") or ""
        if not isinstance(title, str):
            raise ValueError(f"{where}: 'title' must be a string, got {title!r}")
        return Passage(id=str(raw_id), title=title, text=row["text"])
    contents = row.get("contents")
    if not isinstance(contents, str):
        raise ValueError(f"{where}: a row needs a string 'contents' (wiki-18 layout) or 'text'; "
                         f"got keys {sorted(row)}")
    title, text = split_contents(contents)
    return Passage(id=str(raw_id), title=title, text=text)


def split_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``("Title", "text")``; without a quoted title line, ``("", contents)``."""
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        return first[1:-1], rest
    return "", contents


def write_corpus_jsonl(passages: Iterable[Passage], path: str | os.PathLike[str]) -> int:
    """Write ``passages`` as wiki-18 JSONL (``id`` and ``contents``); returns how many were written."""
    with open(path, "wb") as f:
        return sum(1 for _ in _write_rows(passages, f))


def _write_rows(passages: Iterable[Passage], f: BinaryIO) -> Iterator[int]:
    """Writes one JSON line per passage; yields the byte offset at which each line ends."""
    offset = f.tell()
    for p in passages:
        row: dict[str, str] = {"id": p.id, "contents": p.contents}
        if "\n" in p.title:  # the contents layout cannot carry it: keep the fields explicitly
            row.update(title=p.title, text=p.text)
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        f.write(line)
        offset += len(line)
        yield offset


class PassageStore:
    """The passages of an index folder, read by position: ``store[i]`` is the i-th indexed passage."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        folder = Path(folder)
        self._offsets = np.load(folder / OFFSETS_FILE, mmap_mode="r")
        self._fd = os.open(folder / PASSAGES_FILE, os.O_RDONLY)
        self._path = folder / PASSAGES_FILE
        # Not __del__: at interpreter exit the os module may already be torn down when it would run.
        weakref.finalize(self, os.close, self._fd)

    @staticmethod
    def write(passages: Iterable[Passage], folder: str | os.PathLike[str]) -> int:
        """Store ``passages`` in ``folder``; returns how many were stored."""
        folder = Path(folder)
        with (folder / PASSAGES_FILE).open("wb") as f:
            ends = list(_write_rows(passages, f))
        np.save(folder / OFFSETS_FILE, np.asarray([0, *ends], dtype=np.int64))
        return len(ends)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> Passage:
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        line = os.pread(self._fd, end - start, start)
        return _passage(json.loads(line), default_id=str(index), where=f"{self._path}, passage {index}")


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of an index folder, or None when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(folder) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def corpus_fingerprint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies a corpus file for an index built from it: its absolute path, size and mtime."""
    stat = Path(path).stat()
    return {"corpus": str(Path(path).resolve()), "corpus_bytes": stat.st_size, "corpus_mtime_ns": stat.st_mtime_ns}


def resolve_corpus(corpus: str | os.PathLike[str] | None) -> tuple[Path, dict[str, Any], str]:
    """``(path, identity, key)`` of the corpus to index; None means the built-in corpus.

    ``identity`` goes into the manifest and decides whether an index is current (the built-in
    corpus by content hash, a user's file by :func:`corpus_fingerprint`); ``key`` names its
    folder in the cache and stays the same when a user's file changes.
    """
    if corpus is None:
        from .data import builtin_corpus_path

        path = builtin_corpus_path()
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return path, {"corpus_sha256": digest.hexdigest()}, digest.hexdigest()[:16]
    identity = corpus_fingerprint(corpus)
    return Path(corpus), identity, hashlib.sha256(identity["corpus"].encode()).hexdigest()[:16]


@dataclass(frozen=True)
class IndexFormat:
    """The kind of index a folder holds, as its manifest records it (``format``, ``format_version``)."""

    name: str
    version: int
    kind: str  # in messages: "BM25", "dense"
    how_to_build: str  # in the message for a folder without an index

    def header(self) -> dict[str, Any]:
        return {"format": self.name, "format_version": self.version}

    def is_current(self, manifest: Mapping[str, Any] | None, identity: Mapping[str, Any]) -> bool:
        """Whether ``manifest`` is of this format and version and records ``identity`` exactly."""
        expected = {**self.header(), **identity}
        return manifest is not None and all(manifest.get(key) == value for key, value in expected.items())

    def read(self, index_dir: Path) -> dict[str, Any]:
        """The manifest of the index in ``index_dir``; ``FileNotFoundError``/``ValueError`` naming the folder."""
        manifest = read_manifest(index_dir)
        if manifest is None or manifest.get("format") != self.name:
            raise FileNotFoundError(f"{index_dir} holds no {self.kind} index (no {self.name} {MANIFEST_FILE}); "
                                    f"build one with {self.how_to_build}")
        if manifest.get("format_version") != self.version:
            raise ValueError(f"the {self.kind} index in {index_dir} has format version "
                             f"{manifest.get('format_version')}, this skyrl-search reads version {self.version}; "
                             "rebuild it")
        return manifest


def manifest_stamp(index_dir: Path) -> int:
    """The manifest's mtime in ns (0 without one): it changes whenever the folder is rebuilt."""
    manifest = index_dir / MANIFEST_FILE
    return manifest.stat().st_mtime_ns if manifest.exists() else 0


def build_once(index_dir: str | os.PathLike[str], is_current: Callable[[dict[str, Any] | None], bool],
               build: Callable[[Path], dict[str, Any]]) -> Path:
    """Make ``index_dir`` hold a current index, building it at most once across processes.

    ``is_current(manifest)`` says whether an existing folder can be used as it is. Otherwise
    ``build(tmp_folder)`` fills a temporary sibling folder and returns the manifest, which is
    written last; the folder is then renamed into place. A file lock beside the folder makes
    concurrent callers wait for one build. A non-empty folder without a manifest is never
    replaced (``ValueError`` naming it).
    """
    index_dir = Path(index_dir).absolute()
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(index_dir.parent / f".{index_dir.name}.lock"):
        manifest = read_manifest(index_dir)
        if is_current(manifest):
            return index_dir
        if manifest is None and index_dir.exists() and any(index_dir.iterdir()):
            raise ValueError(f"{index_dir} is not empty and holds no index ({MANIFEST_FILE} is missing); "
                             "choose an empty or new folder for the index")
        tmp = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.build-", dir=index_dir.parent))
        try:
            manifest = build(tmp)
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            if index_dir.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.old-", dir=index_dir.parent))
                index_dir.rename(old / "index")
                tmp.rename(index_dir)
                shutil.rmtree(old)
            else:
                tmp.rename(index_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return index_dir


def check_request(queries: Sequence[str], topk: int) -> None:
    """``TypeError``/``ValueError`` for arguments ``retrieve(queries, topk)`` cannot answer."""
    if isinstance(queries, str):
        raise TypeError("retrieve() takes a list of queries, got one string; pass [query]")
    if topk < 1:
        raise ValueError(f"topk must be at least 1, got {topk}")


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
