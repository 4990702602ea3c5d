"""A task's ``artifacts``: paths copied out of the machine after the agent's work on a step, into a host folder.

They are collected once the agent's processes are killed and before the step's tests run, so they
are what the agent left (the tests' own writes are not in them), and nothing can change them while
they are read. Each path is read by root *inside* the machine (``tar``, which stores links as links)
after checking that no folder on the way is a symlink and that the path itself is none. So an
agent's ``/app/out -> /etc/shadow`` is not followed, and on bwrap, where the machine's folders are
the agent's on the host, nothing is ever read through the host's file system. The archive is
written out here by hand: regular files and folders only (links, devices and FIFOs are listed as
skipped), names checked, no file written twice, at most ``max_bytes`` of file contents per
episode (what is over is cut, and :attr:`ArtifactLog.cut` says so).

The host folder is ``<env.artifacts_dir>/<task>/<episode>/<step>/<destination>``.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from skyrl_sandbox.machine import Machine

from .task import Artifact

CACHE_ENV = "SKYRL_HARBOR_CACHE"
# In the machine, as root: the folder holding the path is entered without following a symlink (cd -P, then
# the physical path must be the one asked for), the path itself must be no symlink; then tar, cut at $3 bytes.
_READ = ('d=${1%/*}; d=${d:-/}; name=${1##*/}; cd -P -- "$d" 2>/dev/null && [ "$(pwd -P)" = "$d" ] || exit 3; '
         '[ -L "$name" ] && exit 5; [ -e "$name" ] || exit 4; '
         'tar -cf - -- "$name" 2>/dev/null | head -c "$2"')
_WHY = {3: "a folder on the way is a symlink or missing: not followed", 4: "it does not exist",
        5: "it is a symlink: not followed"}
_STREAM_SLACK = 1 << 20  # tar headers and padding beyond the file contents
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_PROBLEMS = 20


def default_artifacts_dir() -> Path:
    """``$SKYRL_HARBOR_CACHE/artifacts``, else ``~/.cache/skyrl/harbor/artifacts``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "skyrl" / "harbor") / "artifacts"


def episode_folder(root: Path, task_name: str) -> Path:
    """A fresh folder name for one episode of ``task_name`` under ``root`` (not created yet)."""
    task = _SAFE.sub("_", task_name).strip("._") or "task"
    return root / task / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass
class ArtifactLog:
    """What an episode's artifact collection did; :meth:`to_info` is ``info["artifacts"]``."""

    folder: Path
    max_bytes: int
    collected: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    bytes: int = 0
    cut: bool = False

    def problem(self, text: str) -> None:
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(text)
        elif len(self.problems) == _MAX_PROBLEMS:
            self.problems.append("[further problems are not listed]")

    def to_info(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "collected": [dict(entry) for entry in self.collected],
                "bytes": self.bytes, "max_bytes": self.max_bytes, "cut": self.cut, "problems": list(self.problems)}


async def collect_artifacts(machine: Machine, artifacts: tuple[Artifact, ...], step: str, log: ArtifactLog) -> None:
    """Copy each of ``artifacts`` out of ``machine`` into ``log.folder/step/``; what happened goes to ``log``.

    The agent's processes must be dead already. Never raises for what is in the machine.
    """
    for artifact in artifacts:
        left = log.max_bytes - log.bytes
        if left <= 0:
            log.cut = True
            log.problem(f"{artifact.source}: not collected, the episode's {log.max_bytes} artifact bytes are used up")
            continue
        result = await machine.exec(["sh", "-c", _READ, "artifact", artifact.source, str(left + _STREAM_SLACK)],
                                    cwd="/", timeout_s=120, max_output_bytes=left + _STREAM_SLACK)
        if result.exit_code in _WHY:
            log.problem(f"{artifact.source}: not collected, {_WHY[result.exit_code]}")
            continue
        if result.timed_out:
            log.problem(f"{artifact.source}: reading it timed out")
        stream_cut = result.stdout_truncated or len(result.stdout) >= left + _STREAM_SLACK
        target = log.folder / step / artifact.destination
        found, files, written, cut = _write_archive(result.stdout, PurePosixPath(artifact.source).name, target,
                                                    left, log)
        log.bytes += written
        log.cut = log.cut or cut or stream_cut
        if cut or stream_cut:
            log.problem(f"{artifact.source}: cut at the episode's {log.max_bytes} artifact bytes")
        if found:
            log.collected.append({"step": step, "source": artifact.source, "path": str(target), "files": files,
                                  "bytes": written})


def _write_archive(data: bytes, top: str, target: Path, budget: int, log: ArtifactLog
                   ) -> tuple[bool, int, int, bool]:
    """Write the regular files and folders of the tar ``data`` (rooted at ``top``) to ``target``.

    Returns (whether the archive held its top entry, files written, bytes written, whether some were left
    out for the budget or a cut stream).
    """
    found = False
    files = written = 0
    cut = False
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in _members(archive, log):
                rel = _relative(member.name, top)
                where = f"{top}/{rel}" if rel else top
                if rel is None:
                    log.problem(f"{member.name!r}: an unexpected name in the archive, skipped")
                    continue
                found = True
                path = target.joinpath(*PurePosixPath(rel).parts) if rel else target
                if member.isdir():
                    try:
                        path.mkdir(mode=0o755, parents=True, exist_ok=True)
                    except OSError as exc:
                        log.problem(f"{where}: not written to {path} ({exc.strerror or exc})")
                    continue
                if not member.isreg():
                    kind = "a symlink" if member.issym() else "a hard link" if member.islnk() else "not a regular file"
                    log.problem(f"{where}: {kind}, skipped (links are never followed)")
                    continue
                if written + member.size > budget:
                    cut = True
                    continue
                content = _content(archive, member)
                if content is None:  # the stream ended inside this file
                    cut = True
                    break
                if _write_file(path, content, member.mode, where, log):
                    files += 1
                    written += len(content)
    except tarfile.TarError as exc:
        if not found:
            log.problem(f"{top}: the archive from the machine could not be read ({exc})")
        cut = cut or found
    return found, files, written, cut


def _members(archive: tarfile.TarFile, log: ArtifactLog):  # noqa: ANN202 - a generator of TarInfo
    """The archive's members until its end, or until a cut stream ends it."""
    while True:
        try:
            member = archive.next()
        except (tarfile.ReadError, EOFError):
            return
        if member is None:
            return
        yield member


def _relative(name: str, top: str) -> str | None:
    """``name`` below the archive's top entry: "" for the top itself, None for a name outside it."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or parts[0] != top or ".." in parts or name.startswith("/"):
        return None
    return "/".join(parts[1:])


def _content(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes | None:
    try:
        source = archive.extractfile(member)
        content = source.read() if source is not None else b""
    except (tarfile.ReadError, EOFError, OSError):
        return None
    return content if len(content) == member.size else None


def _write_file(path: Path, content: bytes, mode: int, where: str, log: ArtifactLog) -> bool:
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        log.problem(f"{where}: not written to {path} ({exc.strerror or exc})")
        return False
    with os.fdopen(handle, "wb") as out:
        out.write(content)
    os.chmod(path, 0o644 | (mode & 0o111))
    return True
