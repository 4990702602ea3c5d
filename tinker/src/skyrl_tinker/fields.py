"""Typed reads of JSON request fields: a wrong type, a non-finite number or a value out of range is a
:class:`FieldError` (a 400) that names the field, never an error from deep inside the server.

A missing field and an explicit ``null`` both take the default; ``REQUIRED`` fields have none. A
number the client cannot write in JSON (NaN, infinity) reaches the server as ``null``, so a number
that is never optional in Tinker's schema is read with ``nullable=False``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
REQUIRED: Any = object()


class FieldError(ValueError):
    """A request field of the wrong type or out of range; the message names it."""


class Fields:
    """One JSON object of a request; ``where`` prefixes field names in messages (``adam_params.eps``)."""

    def __init__(self, data: Any, where: str = "") -> None:
        if not isinstance(data, Mapping):
            raise FieldError(f"{where or 'the body'} must be a JSON object, got {_kind(data)}")
        self.data = data
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _raw(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is None and default is REQUIRED:
            raise FieldError(f"{self._name(key)} is required")
        return value

    def text(self, key: str, default: Any = REQUIRED) -> Any:
        """A string (``default``, which may be None, when absent)."""
        value = self._raw(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise FieldError(f"{self._name(key)} must be a string, got {_kind(value)}")
        return value

    def integer(self, key: str, default: Any = REQUIRED, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> Any:
        """An integer in ``[lo, hi]`` (an int64 unless narrower bounds are given)."""
        value = self._raw(key, default)
        if value is None:
            return default
        return check_int(value, self._name(key), lo, hi)

    def number(self, key: str, default: Any = REQUIRED, *, lo: float = -math.inf, hi: float = math.inf,
               nullable: bool = True) -> Any:
        """A finite number in ``[lo, hi]``, as a float; with ``nullable=False`` an explicit null is an error."""
        if not nullable and key in self.data and self.data[key] is None:
            raise FieldError(f"{self._name(key)} must be a finite number, got null (the tinker client sends NaN "
                             "and infinity as null)")
        value = self._raw(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FieldError(f"{self._name(key)} must be a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise FieldError(f"{self._name(key)} must be a finite number, got {value}")
        if not lo <= value <= hi:
            raise FieldError(f"{self._name(key)} must be {_range(lo, hi)}, got {value}")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._raw(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise FieldError(f"{self._name(key)} must be true or false, got {_kind(value)}")
        return value

    def obj(self, key: str, *, required: bool = False) -> Fields:
        """A nested object (empty when absent, unless ``required``)."""
        value = self._raw(key, REQUIRED if required else None)
        return Fields({} if value is None else value, self._name(key))

    def items(self, key: str) -> list[Any]:
        """A list (empty when absent)."""
        value = self._raw(key, None)
        if value is None:
            return []
        if not isinstance(value, list):
            raise FieldError(f"{self._name(key)} must be a list, got {_kind(value)}")
        return value

    def __bool__(self) -> bool:
        return bool(self.data)


def check_int(value: Any, name: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """``value`` if it is an integer in ``[lo, hi]``; otherwise a :class:`FieldError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"{name} must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise FieldError(f"{name} must be {_range(lo, hi)}, got {value}")
    return value


def integers(values: list[Any], where: str) -> list[int]:
    """Every item an int64 (token ids: the caller checks them against the vocabulary)."""
    return [check_int(v, f"{where}[{i}]") for i, v in enumerate(values)]


def _range(lo: float, hi: float) -> str:
    if lo == INT64_MIN and hi == INT64_MAX:
        return "an int64"
    if hi == math.inf or hi == INT64_MAX:
        return f">= {lo}"
    if lo == -math.inf or lo == INT64_MIN:
        return f"<= {hi}"
    return f"between {lo} and {hi}"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)
