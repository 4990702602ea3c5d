"""What one command in a sandbox did: the result type of boxes and machines alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunResult:
    """What one command did. Output past ``max_output_bytes`` per stream is dropped and flagged."""

    exit_code: int | None  # None when the sandbox itself broke down; negative: killed by that signal
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
