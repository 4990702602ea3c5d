"""The errors and warnings of reading a Harbor task folder (a leaf: the task model, its loader and the compose
reader all raise them)."""

from __future__ import annotations


class TaskFormatError(ValueError):
    """A task folder that does not follow the Harbor task format; the message names folder and key."""


class HarborTaskWarning(UserWarning):
    """Something in a task that loads but is ignored or changed (unknown key, GPUs, ...)."""
