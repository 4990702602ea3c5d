"""Helpers shared by the skyrl-sandbox tests."""

from __future__ import annotations


def signal_masks(proc_status: str) -> dict[str, int]:
    """The ignored and blocked signal sets of a ``/proc/<pid>/status`` text, as bit masks."""
    fields = dict(line.split(":", 1) for line in proc_status.splitlines() if ":" in line)
    return {name: int(fields[name].strip(), 16) for name in ("SigIgn", "SigBlk")}
