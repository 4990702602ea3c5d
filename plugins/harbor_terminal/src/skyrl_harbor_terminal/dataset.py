"""Harbor task datasets: a folder of task folders, or a Parquet file of tar-archived tasks.

A Parquet dataset (the form Harbor publishes) has a ``path`` column (the task folder's relative
path) and a ``task_binary`` column (a tar archive, optionally compressed, of that folder's
contents). Archives are untrusted input: every member is checked and written by hand, never with
``tarfile.extractall``, and each task lands in place by a rename, so an interrupted extraction
never leaves half a task behind.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from skyrl_harbor_terminal.task import HarborTask, HarborTaskWarning, load_task
from skyrl_harbor_terminal.task_warnings import dataset_warnings

DEFAULT_MAX_TASK_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_MEMBERS = 10_000
CACHE_ENV = "SKYRL_HARBOR_CACHE"
MARKER = ".skyrl-extracted"  # holds the sha256 of the archive the folder came from
PARQUET_COLUMNS = ("path", "task_binary")
PARQUET_HINT = "pip install 'skyrl-harbor-terminal[parquet]'"
_CHUNK = 1024 * 1024


class DatasetError(ValueError):
    """A dataset that cannot be read safely; the message names the file, row and archive member."""


def find_task_dirs(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself when it holds ``task.toml``, else its immediate subfolders that do, by name."""
    folder = Path(path)
    if (folder / "task.toml").is_file():
        return [folder]
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such folder")
    tasks = sorted(child for child in folder.iterdir() if child.is_dir() and (child / "task.toml").is_file())
    if not tasks:
        raise DatasetError(f"{folder}: no Harbor tasks found (no task.toml in it or in its immediate subfolders)")
    return tasks


def load_tasks(path: str | os.PathLike[str], *, extract_dir: str | os.PathLike[str] | None = None,
               max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
               max_members: int = DEFAULT_MAX_MEMBERS) -> list[HarborTask]:
    """Every task in a folder (see :func:`find_task_dirs`) or in a ``.parquet`` dataset."""
    source = Path(path)
    if source.is_file() and source.suffix == ".parquet":
        task_dirs = extract_parquet(source, extract_dir, max_task_bytes=max_task_bytes, max_members=max_members)
    elif source.is_dir():
        task_dirs = find_task_dirs(source)
    else:
        raise DatasetError(f"{source}: neither a folder of Harbor tasks nor a .parquet dataset")
    tasks = [load_task(task_dir, quiet=True) for task_dir in task_dirs]
    for message in dataset_warnings(tasks):  # once per kind, not once per task (each task keeps its own list)
        warnings.warn(message, HarborTaskWarning, stacklevel=2)
    return tasks


def default_extract_dir(parquet: Path) -> Path:
    """``$SKYRL_HARBOR_CACHE`` (else ``~/.cache/skyrl/harbor``) / ``<file stem>-<short content hash>``."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "skyrl" / "harbor")
    digest = hashlib.sha256()
    with parquet.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return root / f"{parquet.stem}-{digest.hexdigest()[:12]}"


def extract_parquet(parquet: str | os.PathLike[str], extract_dir: str | os.PathLike[str] | None = None, *,
                    max_task_bytes: int = DEFAULT_MAX_TASK_BYTES,
                    max_members: int = DEFAULT_MAX_MEMBERS) -> list[Path]:
    """Extract each row's archive into ``extract_dir/<path>``; the task folders in row order.

    A folder already extracted from the same archive bytes is reused as it is.
    """
    parquet = Path(parquet)
    target = Path(extract_dir) if extract_dir is not None else default_extract_dir(parquet)
    target.mkdir(parents=True, exist_ok=True)
    limits = _Limits(max_task_bytes, max_members)
    first_row: dict[PurePosixPath, int] = {}
    ancestors: set[PurePosixPath] = set()
    task_dirs = []
    for row, rel, blob in _parquet_rows(parquet):
        label = f"{parquet} row {row} (path {str(rel)!r})"
        if rel in first_row:
            raise DatasetError(f"{label}: duplicate path, already used by row {first_row[rel]}")
        if rel in ancestors or any(parent in first_row for parent in rel.parents):
            raise DatasetError(f"{label}: one task folder may not be nested inside another")
        first_row[rel] = row
        ancestors.update(rel.parents)
        task_dirs.append(_extract_task(blob, target / rel, label, limits))
    if not task_dirs:
        raise DatasetError(f"{parquet}: the dataset has no rows")
    return task_dirs


def _import_parquet() -> Any:
    try:
        import pyarrow.parquet
    except ImportError as exc:
        raise ImportError(f"reading Parquet task datasets needs pyarrow: {PARQUET_HINT}") from exc
    return pyarrow.parquet


def _parquet_rows(parquet: Path) -> Iterator[tuple[int, PurePosixPath, bytes]]:
    """(row number, checked relative path, archive bytes) for each row."""
    pq = _import_parquet()
    try:
        file = pq.ParquetFile(parquet)
    except Exception as exc:  # pyarrow raises its own error types for unreadable files
        raise DatasetError(f"{parquet}: not a readable Parquet file: {exc}") from exc
    present = file.schema_arrow.names
    missing = [name for name in PARQUET_COLUMNS if name not in present]
    if missing:
        raise DatasetError(f"{parquet}: missing column(s) {', '.join(missing)}; "
                           f"the columns present are {', '.join(present) or '(none)'}")
    row = 0
    for batch in file.iter_batches(batch_size=64, columns=list(PARQUET_COLUMNS)):
        for path, blob in zip(batch.column("path").to_pylist(), batch.column("task_binary").to_pylist(), strict=True):
            label = f"{parquet} row {row} (path {path!r})"
            if not isinstance(blob, bytes):
                raise DatasetError(f"{label}: task_binary must be bytes, got {type(blob).__name__}")
            yield row, _row_path(path, label), blob
            row += 1


def _row_path(value: Any, label: str) -> PurePosixPath:
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{label}: path must be a non-empty string")
    rel = PurePosixPath(value)
    if rel.is_absolute() or "\\" in value or "\0" in value or any(part in ("..", ".") for part in value.split("/")):
        raise DatasetError(f"{label}: path must be a relative folder path without '..' or '.' parts")
    return rel


@dataclass(frozen=True)
class _Limits:
    max_bytes: int
    max_members: int


def _extract_task(blob: bytes, final: Path, label: str, limits: _Limits) -> Path:
    """Extract into a temporary sibling folder and rename it into place."""
    digest = hashlib.sha256(blob).hexdigest()
    if _is_complete(final, digest):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=final.parent))
    try:
        _extract_members(blob, staging, label, limits)
        (staging / MARKER).write_text(digest + "\n", encoding="ascii")
        staging.chmod(0o755)
        _move_into_place(staging, final, digest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _is_complete(folder: Path, digest: str) -> bool:
    try:
        return (folder / MARKER).read_text(encoding="ascii").strip() == digest
    except OSError:
        return False


def _move_into_place(staging: Path, final: Path, digest: str) -> None:
    """Rename ``staging`` to ``final``, replacing a stale folder; a racing writer's equal copy wins."""
    if final.exists() or final.is_symlink():
        stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=final.parent))
        final.rename(stale / "task")
        shutil.rmtree(stale, ignore_errors=True)
    try:
        staging.rename(final)
    except OSError:
        if not _is_complete(final, digest):
            raise


def _extract_members(blob: bytes, dest: Path, label: str, limits: _Limits) -> None:
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
            _write_members(archive, dest, label, limits)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{label}: unreadable or damaged task archive: {exc}") from exc


def _write_members(archive: tarfile.TarFile, dest: Path, label: str, limits: _Limits) -> None:
    written = 0
    for count, member in enumerate(archive, start=1):
        where = f"{label}: archive member {member.name!r}"
        if count > limits.max_members:
            raise DatasetError(f"{where}: the archive has more than {limits.max_members} members")
        rel = _member_path(member, where)
        if rel is None:
            continue
        if written + member.size > limits.max_bytes:
            raise DatasetError(f"{where}: the task would exceed {limits.max_bytes} bytes uncompressed")
        try:
            written = _write_member(archive, member, dest.joinpath(*rel.parts), written, limits.max_bytes, where)
        except OSError as exc:
            raise DatasetError(f"{where}: cannot be written: {exc}") from exc


def _write_member(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path,
                  written: int, max_bytes: int, where: str) -> int:
    if member.isdir():
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.chmod(0o755)
        return written
    return _write_file(archive, member, path, written, max_bytes, where)


def _member_path(member: tarfile.TarInfo, where: str) -> PurePosixPath | None:
    """The member's checked relative path; None for the archive's root entry (``.``)."""
    name = member.name
    if member.issym() or member.islnk():
        raise DatasetError(f"{where}: links are not allowed (it points to {member.linkname!r})")
    if not (member.isreg() or member.isdir()):
        raise DatasetError(f"{where}: only regular files and folders are allowed")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts:
        raise DatasetError(f"{where}: absolute names, '..' parts and backslashes are not allowed")
    if not parts:
        if member.isdir():
            return None
        raise DatasetError(f"{where}: not a valid file name")
    return PurePosixPath(*parts)


def _write_file(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path,
                written: int, max_bytes: int, where: str) -> int:
    """Copy one member, counting the bytes actually written against the task's cap."""
    source = archive.extractfile(member)
    if source is None:
        raise DatasetError(f"{where}: has no readable content")
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError as exc:
        raise DatasetError(f"{where}: appears twice in the archive") from exc
    with os.fdopen(handle, "wb") as out, source:
        while chunk := source.read(_CHUNK):
            written += len(chunk)
            if written > max_bytes:
                raise DatasetError(f"{where}: the task exceeds {max_bytes} bytes uncompressed")
            out.write(chunk)
    path.chmod(0o644 | (member.mode & 0o111))
    return written
