"""Testing helpers for env and plugin authors: the conformance checker and (via the ``pytest11``
entry point) pytest fixtures. See :func:`check_env`."""

from skyrl_core.testing.check import EnvCheckError, check_env

__all__ = ["EnvCheckError", "check_env"]
