"""Host folders of sandboxes: one per owning process, one per worker, swept when their owner died."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .cgroups import alive, sweep_stale_groups

log = logging.getLogger(__name__)
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
        remove_tree(folder)


def remove_tree(folder: Path) -> str | None:
    """Remove ``folder`` and everything in it; None once it is gone, else why not (also logged as a warning).

    Sandboxed code owns what it wrote in its folders (as this process's uid, where the host is not root), so
    a folder it made unwritable or unsearchable (``chmod 500``/``000``, nested deeper than Python recurses)
    stops a plain ``rmtree``: then the owner's permissions are given back (``chmod -R``, which changes a folder
    before it enters it and follows no symlink) and ``rm -rf`` removes the rest.
    """
    try:
        shutil.rmtree(folder, ignore_errors=True)
    except RecursionError:  # a tree nested deeper than Python recurses: rm -rf below has no such limit
        pass
    if _gone(folder):
        return None
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(folder)], capture_output=True, check=False)
    removed = subprocess.run(["rm", "-rf", "--", str(folder)], capture_output=True, text=True, check=False)
    if _gone(folder):
        return None
    problem = (removed.stderr.strip().splitlines() or ["it is still there"])[-1][:300]
    log.warning("could not remove the sandbox folder %s: %s", folder, problem)
    return problem


def _gone(path: Path) -> bool:
    """Whether nothing is at ``path`` (one this process cannot even look at is still there)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def sweep_stale_dirs(root: str | None = None) -> list[Path]:
    """Remove the folders of processes that died without cleaning up; returns those removed (the rest are
    logged as warnings with the reason)."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_PROCESS_DIR_PREFIX}*"):
        owner = folder.name[len(_PROCESS_DIR_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not alive(int(owner)) and remove_tree(folder) is None:
            removed.append(folder)
    return removed


def make_host_dir() -> Path:
    """A private folder per worker: ``inbox/`` (parent writes, worker reads) and ``tmp/``."""
    host_dir = Path(tempfile.mkdtemp(prefix="worker-", dir=process_dir()))
    (host_dir / "inbox").mkdir()
    (host_dir / "tmp").mkdir()
    return host_dir
