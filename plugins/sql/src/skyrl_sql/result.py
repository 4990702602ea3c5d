"""The records that cross the sandbox boundary (defined in :mod:`skyrl_sql.worker.result`, which the worker shares)."""

from skyrl_sql.worker.result import Cut, QueryRequest, QueryResult, Status

__all__ = ["Cut", "QueryRequest", "QueryResult", "Status"]
