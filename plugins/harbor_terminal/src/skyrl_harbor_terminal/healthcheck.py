"""A task's or step's healthcheck: its command, run as root in the machine until it passes or its retries run out.

The shape is Harbor's HealthcheckConfig (``command``, ``interval_sec``, ``timeout_sec``, ``retries``,
``start_period_sec``) and the semantics Docker's HEALTHCHECK: tries ``interval_sec`` apart, failures
within ``start_period_sec`` of the first try do not count, and the check fails at the
``retries + 1``-th counted failure. Each try is ended by ``timeout`` inside the machine, so a hung
try does not need the machine-wide kill of an exec's own time-out (which would also end what a
setup script started for the agent).
"""

from __future__ import annotations

import asyncio
import shlex
import time

from skyrl_sandbox.machine import Machine

from .provision import TaskEnvironmentError
from .task import Healthcheck

_TRY = ('if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL "$1" bash -c "$2"; '
        'else exec bash -c "$2"; fi')
_TIMED_OUT = (124, 137)
_MARGIN_S = 15.0


class HealthcheckFailed(TaskEnvironmentError):
    """The healthcheck never passed; the message names what it checked, the command and its last output."""


async def run_healthcheck(machine: Machine, check: Healthcheck, what: str) -> int:
    """Try ``check`` in ``machine`` until it passes; the number of tries. :class:`HealthcheckFailed` when it never does.

    ``what`` names the check in the error ("task x: step y's healthcheck").
    """
    started = time.monotonic()
    tries = counted = 0
    while True:
        tries += 1
        result = await machine.exec(["sh", "-c", _TRY, "healthcheck", f"{check.timeout_sec:g}", check.command],
                                    timeout_s=check.timeout_sec + _MARGIN_S, max_output_bytes=4096)
        if result.ok:
            return tries
        if time.monotonic() - started >= check.start_period_sec:
            counted += 1
        if counted > check.retries:
            output = (result.stderr or result.stdout).decode(errors="replace").strip()[-600:]
            how = (f"timed out after {check.timeout_sec:g} s" if result.timed_out or result.exit_code in _TIMED_OUT
                   else f"exit {result.exit_code}")
            raise HealthcheckFailed(f"{what} {shlex.quote(check.command)[:200]} did not pass in {tries} tries "
                                    f"({counted} counted, retries = {check.retries}); the last one: {how}"
                                    + (f": {output}" if output else ""))
        await asyncio.sleep(check.interval_sec)
