"""Per-worker control groups: the limits that bind even for uid 0 inside the sandbox.

RLIMIT_NPROC does not bind when the sandbox user maps to host root (the kernel exempts root), and
RLIMIT_AS does not count tmpfs pages or memfd files. A ``pids`` and a ``memory`` cgroup per worker
count every thread and every page the worker can pin. The worker joins its groups before it
executes anything (``Popen(preexec_fn=...)``), so everything it starts is counted from the first
instruction.

Works with cgroup v1 (``/sys/fs/cgroup/{pids,memory}``, plus ``freezer`` where mounted) and v2 (a
parent group with both controllers delegated), as root or wherever the hierarchy is writable. Where
neither is, the sandbox falls back to RLIMIT_NPROC (binding for non-root users), bounded tmpfs sizes
and no memfd.

Which processes are alive is the group's own word: ``cgroup.procs`` lists every process that has a
thread left (a leader that exited while its threads run included) and no zombie, so a kill is
proven by that list, never by reading process states from ``/proc``.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")
_PREFIX = "skyrl-sandbox-"
_counter = itertools.count()


@dataclass(frozen=True)
class _Controller:
    """One cgroup directory holding a worker, and the files that set and report its limit."""

    parent: Path
    limit_files: tuple[tuple[str, str | None], ...]  # (file, fixed value or None for the limit), in order
    oom_file: str | None  # a 'key value' file whose oom_kill line counts OOM kills


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-worker groups go on this machine (``version`` 1 or 2)."""

    version: int
    pids: _Controller
    memory: _Controller
    freezer: _Controller | None = None  # v1's freezer controller; v2 freezes with cgroup.freeze in the pids group

    def describe(self) -> str:
        return f"cgroup v{self.version} (pids under {self.pids.parent}, memory under {self.memory.parent})"


class WorkerCgroup:
    """The groups of one worker: created with its limits, joined by the worker, removed after it."""

    def __init__(self, support: CgroupSupport, pids_max: int, memory_bytes: int) -> None:
        name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        self.support = support
        self.dirs: list[Path] = []
        limited = [(support.pids, pids_max), (support.memory, memory_bytes)]
        if support.freezer is not None:  # between the two: dirs[0] stays the pids group, dirs[-1] the memory one
            limited.insert(1, (support.freezer, 0))
        try:
            for controller, value in limited:
                folder = controller.parent / name
                if folder not in self.dirs:
                    folder.mkdir()
                    self.dirs.append(folder)
                for filename, fixed in controller.limit_files:
                    if (folder / filename).exists():
                        (folder / filename).write_text(fixed or str(value))
        except OSError:
            self.remove()
            raise
        self._procs_paths = [str(folder / "cgroup.procs") for folder in self.dirs]
        # v1: the freezer group's own file; v2: a core file of the group itself (kernel 5.2+)
        control = support.freezer.parent / name / "freezer.state" if support.freezer else self.dirs[0] / "cgroup.freeze"
        self.freezer: Path | None = control if control.exists() else None

    def join(self) -> None:
        """Move the calling process into the groups (runs in the forked child, before exec)."""
        for path in self._procs_paths:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def task_count(self) -> int | None:
        """Threads and processes in the worker's pids group right now (None once removed)."""
        try:
            return int((self.dirs[0] / "pids.current").read_text())
        except (OSError, IndexError, ValueError):
            return None

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this worker for exceeding the memory limit."""
        controller = self.support.memory
        if controller.oom_file is None:
            return False
        try:
            text = (controller.parent / self.dirs[-1].name / controller.oom_file).read_text()
        except (OSError, IndexError):
            return False
        counts = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
        return int(counts.get("oom_kill", "0")) > 0

    def members(self) -> set[int]:
        """The processes alive in the worker's groups (empty once removed)."""
        found: set[int] = set()
        for folder in self.dirs:
            found |= members(folder)
        return found

    def kill_all(self, timeout_s: float = 5.0) -> set[int]:
        """Kill every member, frozen, until the groups list none (see :func:`kill_until_gone`); the survivors."""
        return kill_until_gone(self.members, self.freezer, timeout_s)

    def remove(self) -> None:
        """Kill whatever is left in the groups, then remove them (idempotent)."""
        for folder in self.dirs:
            _remove_group(folder)
        self.dirs = []


@functools.cache
def cgroup_support() -> CgroupSupport | None:
    """How per-worker groups can be made here, or None (probed once per process)."""
    return _probe_v1() or _probe_v2()


def _probe_v1() -> CgroupSupport | None:
    own = _own_groups()
    pids_root, memory_root = _ROOT / "pids", _ROOT / "memory"
    if not (pids_root / "cgroup.procs").exists() or not (memory_root / "cgroup.procs").exists():
        return None
    pids_parent = pids_root / own.get("pids", "/").lstrip("/")
    memory_parent = memory_root / own.get("memory", "/").lstrip("/")
    if not (_writable(pids_parent) and _writable(memory_parent)):
        return None
    freezer_parent = _ROOT / "freezer" / own.get("freezer", "/").lstrip("/")
    freezer = _Controller(freezer_parent, (), None) if _writable(freezer_parent) and \
        (freezer_parent / "cgroup.procs").exists() else None
    return CgroupSupport(
        1, _Controller(pids_parent, (("pids.max", None),), None),
        _Controller(memory_parent, (("memory.limit_in_bytes", None), ("memory.memsw.limit_in_bytes", None)),
                    "memory.oom_control"), freezer)


def _probe_v2() -> CgroupSupport | None:
    own = _own_groups().get("")
    if own is None or not (_ROOT / "cgroup.controllers").exists():
        return None
    # A group holding processes cannot hand controllers to children, so workers go beside ours.
    parent = (_ROOT / own.lstrip("/")).parent
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    if not {"pids", "memory"} <= enabled or not _writable(parent):
        return None
    memory = _Controller(parent, (("memory.max", None), ("memory.swap.max", "0")), "memory.events")
    return CgroupSupport(2, _Controller(parent, (("pids.max", None),), None), memory)


def _own_groups(pid: int | str = "self") -> dict[str, str]:
    """A process's group per controller ('' is the v2 hierarchy), from /proc/<pid>/cgroup (this one's by default)."""
    groups: dict[str, str] = {}
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            groups[controller] = path
    return groups


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK)


def _remove_group(folder: Path) -> None:
    if (folder / "freezer.state").exists():  # left frozen by an owner that died mid-kill: its members die thawed
        freeze(folder / "freezer.state", False)
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # still populated: kill the stragglers, give the kernel a moment
            _kill_members(folder)
            time.sleep(0.01)


def _kill_members(folder: Path) -> None:
    sigkill(members(folder))


def sigkill(pids: Iterable[int]) -> None:
    """SIGKILL each process (one already gone is fine)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def members(folder: Path) -> set[int]:
    """The processes in a group, from its ``cgroup.procs`` (empty when the group is gone)."""
    try:
        return {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def kill_until_gone(list_members: Callable[[], set[int]], freezer: Path | None, timeout_s: float) -> set[int]:
    """SIGKILL what ``list_members`` lists, with the group frozen (``freezer``: a :func:`freezer_of` file, or
    None), again for members that appear, until it lists none or ``timeout_s`` passed; what it lists last.

    The list is the group's own (``cgroup.procs``), so the kill is proven, not assumed.
    """
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    while True:
        left = list_members()
        if not left or time.monotonic() >= deadline:
            return left
        if left - killed:
            frozen = freezer is not None and freeze(freezer, True)
            try:
                targets = list_members()
                sigkill(targets)
                killed |= targets
            finally:
                if frozen:
                    freeze(freezer, False)
        time.sleep(0.005)


def group_of(pid: int) -> Path | None:
    """The folder of the group holding ``pid`` (v1: its pids group; v2: its group), None when not visible here.

    For a process this one can see in ``/proc`` whose groups are mounted here (a container of a local engine).
    """
    groups = _own_groups(pid)
    if "pids" in groups:
        candidates = [_ROOT / "pids" / groups["pids"].lstrip("/")]
    else:
        candidates = [_ROOT / groups.get("", "/").lstrip("/"), _ROOT / "unified" / groups.get("", "/").lstrip("/")]
    return next((folder for folder in candidates if pid in members(folder)), None)


def freezer_of(pid: int) -> Path | None:
    """The file that freezes the group holding ``pid`` (v1: ``freezer.state``; v2: ``cgroup.freeze``), if any."""
    groups = _own_groups(pid)
    if "freezer" in groups:
        control = _ROOT / "freezer" / groups["freezer"].lstrip("/") / "freezer.state"
    else:
        folder = group_of(pid)
        control = folder / "cgroup.freeze" if folder is not None else None
    return control if control is not None and control.exists() else None


def freeze(control: Path, frozen: bool) -> bool:
    """Freeze (waiting until every member is frozen, 1 s at most) or thaw the group of a :func:`freezer_of` file.

    Returns False where the group cannot be frozen. A process killed while frozen dies as it thaws, before it
    runs another instruction; frozen, no process can fork a child that a kill would miss.
    """
    v1 = control.name == "freezer.state"
    value = ("FROZEN" if frozen else "THAWED") if v1 else ("1" if frozen else "0")
    try:
        control.write_text(value)
        for _ in range(500 if frozen else 0):
            state = control.read_text().strip() if v1 else (control.parent / "cgroup.events").read_text()
            if (state == value) if v1 else ("frozen 1" in state):
                break
            time.sleep(0.002)
    except OSError:
        return False
    return True


def sweep_stale_groups() -> int:
    """Kill and remove the groups of owners that died without cleaning up; returns how many."""
    support = cgroup_support()
    if support is None:
        return 0
    removed = 0
    for parent in {support.pids.parent, support.memory.parent, *([support.freezer.parent] if support.freezer else [])}:
        for folder in parent.glob(f"{_PREFIX}*"):
            owner = folder.name[len(_PREFIX):].split("-", 1)[0]
            if owner.isdigit() and not alive(int(owner)):
                _remove_group(folder)
                removed += 1
    return removed


def may_signal(pid: int) -> bool:
    """Whether this process may send ``pid`` signals (a rootless engine's containers run as other users)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return False
    except ProcessLookupError:
        return True
    return True


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
