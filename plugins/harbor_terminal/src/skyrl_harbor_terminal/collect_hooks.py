"""A step's ``[verifier] collect`` commands, run in the agent's machine once the agent's processes are gone.

They snapshot state into files before the artifacts are copied out (Harbor's collect hooks on its main
service). Best effort, as in Harbor: a command that fails or times out is logged and the step goes on;
what it left undone shows in what the tests find.
"""

from __future__ import annotations

import logging

from skyrl_sandbox.machine import Machine

from .task_model import CollectHook

log = logging.getLogger(__name__)


async def run_collect_hooks(machine: Machine, hooks: tuple[CollectHook, ...], where: str) -> None:
    """Run ``hooks`` in order with ``bash -c`` in ``/`` (root unless a hook names a user)."""
    for hook in hooks:
        result = await machine.exec(["bash", "-c", hook.command], user=hook.user or "root", cwd="/",
                                    timeout_s=hook.timeout_sec)
        if result.timed_out or not result.ok:
            outcome = f"timed out after {hook.timeout_sec:g} s" if result.timed_out else f"exit {result.exit_code}"
            log.warning("%s: [verifier] collect command %r failed (%s): %s", where, hook.command, outcome,
                        (result.stderr or result.stdout).decode(errors="replace")[-500:])
