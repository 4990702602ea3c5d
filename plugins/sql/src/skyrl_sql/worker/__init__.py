"""The query worker: the code that runs inside the sandbox, mounted there as ``skyrl_sql_worker``.

Standard library, ``skyrl_sandbox_runtime`` and the database drivers (``sqlite3``, ``duckdb``)
only, with relative imports, so the same files import as ``skyrl_sql.worker`` in the trainer
process (the request/result records, the in-process executor of ``bench/sql_env.py``).
"""
