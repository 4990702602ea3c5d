"""One error hierarchy for every backend.

Problems caused by sandboxed code (its exceptions, a limit it hit, a time-out) are results, never
exceptions: these are raised only when the sandbox itself fails.
"""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed: it would not start, broke down, or was used wrongly."""


class BackendUnavailable(SandboxError):
    """A backend that was asked for (or required) cannot run here; the message says what is missing."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(reason)
        self.backend = backend


class ProtocolViolation(SandboxError):
    """The worker sent something that is not a valid message (forged, stray, oversized or malformed)."""


class WorkerGone(SandboxError):
    """The worker's channel closed: the process exited, was killed, or closed its end."""


class ProcessesSurvived(SandboxError):
    """Processes of a machine were still running after every one of them was killed.

    What the machine's code did (a process that keeps escaping the kill), not a failure of the sandbox:
    callers score it as the agent's failure. ``survivors`` are host pids, as the machine's cgroup lists them.
    """

    def __init__(self, message: str, survivors: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.survivors = survivors
