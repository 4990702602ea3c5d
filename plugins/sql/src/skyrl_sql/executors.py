"""The query executor of the sandbox worker, importable in-process (e.g. by ``bench/sql_env.py``).

Defined in :mod:`skyrl_sql.worker.executors`; the trainer itself runs every query through
:mod:`skyrl_sql.sandbox`, never here.
"""

from skyrl_sql.worker.executors import connect, execute, jsonable

__all__ = ["connect", "execute", "jsonable"]
