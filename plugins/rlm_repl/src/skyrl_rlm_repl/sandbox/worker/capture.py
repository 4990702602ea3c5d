"""A capped text stream that stands in for sys.stdout/sys.stderr while model code runs."""

from __future__ import annotations

import io


class OutputBudget:
    """Characters of output one execution may keep; everything past it is only counted."""

    def __init__(self, limit: int) -> None:
        self.remaining = limit
        self.cut = 0


class CappedStream(io.TextIOBase):
    def __init__(self, budget: OutputBudget) -> None:
        self._budget = budget
        self._parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        kept = text[: max(self._budget.remaining, 0)]
        self._parts.append(kept)
        self._budget.remaining -= len(kept)
        self._budget.cut += len(text) - len(kept)
        return len(text)

    def getvalue(self) -> str:
        return "".join(self._parts)
