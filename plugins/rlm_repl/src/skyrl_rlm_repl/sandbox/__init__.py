"""Isolated, persistent Python REPL for model-written code.

Each sandbox is one worker process (bubblewrap namespaces; a limited subprocess only when the
user opts in) that keeps its namespace across :meth:`Sandbox.execute` calls and forwards sub-model
calls (``llm_query`` and friends) to an async handler in the parent.
"""

from skyrl_sandbox import SandboxError

from .config import REPL_PROGRAM, SandboxConfig
from .result import ExecResult
from .sandbox import DEFAULT_RPC_METHODS, RequestHandler, Sandbox, shared_pool

__all__ = ["DEFAULT_RPC_METHODS", "REPL_PROGRAM", "ExecResult", "RequestHandler", "Sandbox", "SandboxConfig",
           "SandboxError", "shared_pool"]
