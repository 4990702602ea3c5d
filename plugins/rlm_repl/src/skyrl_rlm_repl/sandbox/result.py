"""What one execute() returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExecResult:
    """Outcome of running one block of model code."""

    stdout: str
    stderr: str
    error: str | None  # formatted exception from model code, or a limit / restart message
    timed_out: bool
    truncated_chars: int  # characters of stdout+stderr cut beyond SandboxConfig.max_output_chars
    final_answer: str | None  # what FINAL(x)/FINAL_VAR(name) submitted in this execution (recorded by the parent)
    duration_s: float
    sandbox_restarted: bool  # the worker was replaced: every variable of earlier executes is gone
    subcall_wait_s: float = 0.0  # part of duration_s spent waiting for the sub-call handler
