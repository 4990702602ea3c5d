"""Isolated, persistent Python REPL for model-written code.

Each sandbox is one worker process (bubblewrap namespaces; a limited subprocess only when the
user opts in) that keeps its namespace across :meth:`Sandbox.execute` calls and forwards sub-model
calls (``llm_query`` and friends) to an async handler in the parent.
"""

from .config import SandboxConfig
from .pool import SandboxPool
from .result import ExecResult, SandboxError
from .sandbox import DEFAULT_RPC_METHODS, RequestHandler, Sandbox

__all__ = ["DEFAULT_RPC_METHODS", "ExecResult", "RequestHandler", "Sandbox", "SandboxConfig", "SandboxError",
           "SandboxPool"]
