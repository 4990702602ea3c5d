"""Runs inside the sandbox (as ``skyrl_sandbox_runtime``): standard library only, imported by worker programs."""
