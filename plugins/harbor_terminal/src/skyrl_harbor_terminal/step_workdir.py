"""A step's ``steps/<name>/workdir/`` uploaded into the machine's work directory, as Harbor does before the step.

The files land owned by the agent user with their execute bits (mode 0644 plus the task file's
execute bits). They are first put into a root-owned staging folder, and then copied into the work
directory *by the agent user*: after step one the work directory is the agent's, and a symlink it
left there (``/app/data -> /etc``) must not turn a copy made as root into a write where the agent
cannot write. As the agent, the copy can only reach what the agent could already change, and a
copy that meets such a link fails (an agent failure after the agent's first command).
"""

from __future__ import annotations

import posixpath
import shlex

from skyrl_sandbox.machine import Machine

from .provision import TaskEnvironmentError
from .task import HarborTask, Step

STAGING_DIR = "/logs/.step-workdir"
_CHUNK = 200  # paths per command line


async def upload_step_workdir(machine: Machine, task: HarborTask, step: Step) -> int:
    """Copy ``step``'s workdir folder into the work directory; the number of files. TaskEnvironmentError on failure."""
    files, modes, empty = task.workdir_files(step)
    if not files and not empty:
        return 0
    workdir = machine.spec.workdir
    # The staging folder is removed first: a link or file the agent left in its place (bwrap) goes with it.
    await _root(machine, f"rm -rf {STAGING_DIR} && mkdir -p {STAGING_DIR} && chmod 755 {STAGING_DIR}", step)
    try:
        await machine.put_files(STAGING_DIR, files)
        by_mode: dict[int, list[str]] = {}
        for name, mode in modes.items():
            by_mode.setdefault(0o644 | (mode & 0o111), []).append(posixpath.join(STAGING_DIR, name))
        commands = [f"chmod {mode:o} -- {' '.join(map(shlex.quote, paths[i:i + _CHUNK]))}"
                    for mode, paths in by_mode.items() for i in range(0, len(paths), _CHUNK)]
        commands += [f"mkdir -p -- {shlex.quote(posixpath.join(STAGING_DIR, name))}" for name in empty]
        for i in range(0, len(commands), _CHUNK):
            await _root(machine, " && ".join(commands[i:i + _CHUNK]), step)
        copied = await machine.exec(["cp", "-Rp", "--", f"{STAGING_DIR}/.", f"{workdir}/"],
                                    user=machine.spec.agent_user, cwd="/", timeout_s=120)
        if not copied.ok:
            raise TaskEnvironmentError(
                f"task {task.name}: uploading step {step.name}'s workdir/ into {workdir} as "
                f"{machine.spec.agent_user} failed (exit {copied.exit_code}): "
                f"{(copied.stderr or copied.stdout).decode(errors='replace')[-800:]}")
    finally:
        await machine.exec(["rm", "-rf", STAGING_DIR], cwd="/", timeout_s=60)
    return len(files)


async def _root(machine: Machine, script: str, step: Step) -> None:
    result = await machine.exec(["sh", "-c", script], cwd="/", timeout_s=60)
    if not result.ok:
        raise TaskEnvironmentError(f"preparing step {step.name}'s workdir/ upload failed (exit {result.exit_code}): "
                                   f"{result.stderr.decode(errors='replace')[-500:]}")
