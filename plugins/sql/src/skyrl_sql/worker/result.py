"""The records that cross the sandbox boundary: a query request and its result (plain JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "refused", "timeout", "crashed"]
Cut = Literal["rows", "bytes"]


@dataclass(frozen=True)
class QueryRequest:
    engine: str
    db_path: str
    sql: str
    timeout_s: float
    max_rows: int
    max_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QueryResult:
    """What a query did. ``cut`` says which cap stopped fetching; rows before it are kept."""

    status: Status
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    cut: Cut | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "columns": self.columns, "rows": [list(r) for r in self.rows],
                "cut": self.cut, "message": self.message}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueryResult:
        return cls(status=data["status"], columns=list(data.get("columns", [])),
                   rows=[tuple(r) for r in data.get("rows", [])], cut=data.get("cut"),
                   message=str(data.get("message", "")))
