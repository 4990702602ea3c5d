"""Host folders of sandboxes: one per owning process, one per worker, swept when their owner died."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from .cgroups import alive, sweep_stale_groups

_PROCESS_DIR_PREFIX = "skyrl-sandboxes-"
_process_dirs: dict[int, Path] = {}


def process_dir() -> Path:
    """This process's folder for worker folders, made on first use after sweeping dead owners' leftovers."""
    pid = os.getpid()
    if pid not in _process_dirs:
        sweep_stale()
        _process_dirs[pid] = Path(tempfile.mkdtemp(prefix=f"{_PROCESS_DIR_PREFIX}{pid}-"))
        atexit.register(_remove_own_dir, pid, _process_dirs[pid])
    return _process_dirs[pid]


def sweep_stale() -> None:
    """Remove what owners that died without cleaning up (e.g. SIGKILL) left: folders and cgroups."""
    sweep_stale_dirs()
    sweep_stale_groups()


def _remove_own_dir(owner_pid: int, folder: Path) -> None:
    if os.getpid() == owner_pid:  # not from a forked copy exiting
        shutil.rmtree(folder, ignore_errors=True)


def sweep_stale_dirs(root: str | None = None) -> list[Path]:
    """Remove the folders of processes that died without cleaning up; returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_PROCESS_DIR_PREFIX}*"):
        owner = folder.name[len(_PROCESS_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def make_host_dir() -> Path:
    """A private folder per worker: ``inbox/`` (parent writes, worker reads) and ``tmp/``."""
    host_dir = Path(tempfile.mkdtemp(prefix="worker-", dir=process_dir()))
    (host_dir / "inbox").mkdir()
    (host_dir / "tmp").mkdir()
    return host_dir
