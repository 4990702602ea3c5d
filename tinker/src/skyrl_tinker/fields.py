"""Typed reads of JSON request fields: a wrong type, a number that is not finite as a float32 or a value out
of range is a :class:`FieldError` (a 400) that names the field and quotes no more than 80 characters of
the value, never an error from deep inside the server.

A missing field and an explicit ``null`` both take the default; ``REQUIRED`` fields have none. A
number the client cannot write in JSON (NaN, infinity) reaches the server as ``null``, so a number
that is never optional in Tinker's schema is read with ``nullable=False``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from skyrl_core.http_hygiene import shown

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
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

    def number(self, key: str, default: Any = REQUIRED, *, lo: float = -FLOAT32_MAX, hi: float = FLOAT32_MAX,
               above: bool = False, nullable: bool = True) -> Any:
        """A number in ``[lo, hi]`` (``(lo, hi]`` when ``above``) as a float (see :func:`check_number`); with
        ``nullable=False`` an explicit null is an error."""
        if not nullable and key in self.data and self.data[key] is None:
            raise FieldError(f"{self._name(key)} must be a finite number, got null (the tinker client sends NaN "
                             "and infinity as null)")
        value = self._raw(key, default)
        if value is None:
            return default
        return check_number(value, self._name(key), lo, hi, above=above)

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
        raise FieldError(f"{name} must be {_range(lo, hi)}, got {shown(value)}")
    return value


def check_number(value: Any, name: str, lo: float = -FLOAT32_MAX, hi: float = FLOAT32_MAX, *,
                 above: bool = False) -> float:
    """``value`` as a float if it is a number whose float32 rounding is finite and in ``[lo, hi]`` (``(lo, hi]``
    when ``above``); otherwise a :class:`FieldError` naming ``name``.

    The one numeric rule at the server's edge: the model computes in float32 (or narrower), so a value is
    judged as it will be used. ``3e38`` is finite as float64 but not as float32, ``1e-46`` is positive as
    float64 but 0 as float32, and a 401-digit integer is no float at all: each is refused here, by the name
    of the field, instead of failing (or silently computing NaN) deep inside the server.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{name} must be a number, got {_kind(value)}")
    try:
        as_float = float(value)
    except OverflowError:
        raise FieldError(f"{name} must be a finite number that fits a float32, got an integer of "
                         f"{len(str(abs(value)))} digits") from None
    as_float32 = float(np.float32(as_float)) if abs(as_float) <= FLOAT32_MAX else math.inf
    if not math.isfinite(as_float32):
        raise FieldError(f"{name} must be a finite number that fits a float32 (at most {FLOAT32_MAX:.4g} in size), "
                         f"got {shown(value)}")
    if not (lo < as_float32 if above else lo <= as_float32) or as_float32 > hi:
        where = "as a float32, " if as_float32 != as_float else ""
        raise FieldError(f"{name} must be {_range(lo, hi, above)}, got {where}{shown(as_float32)}")
    return as_float


def integers(values: list[Any], where: str) -> list[int]:
    """Every item an int64 (token ids: the caller checks them against the vocabulary)."""
    return [check_int(v, f"{where}[{i}]") for i, v in enumerate(values)]


def at_most(items: list[Any], most: int, name: str) -> list[Any]:
    """``items`` if there are at most ``most`` (work per request stays bounded whatever the body's size)."""
    if len(items) > most:
        raise FieldError(f"{name} may hold at most {most} entries, got {len(items)}")
    return items


def _range(lo: float, hi: float, above: bool = False) -> str:
    if lo == INT64_MIN and hi == INT64_MAX:
        return "an int64"
    low = f"> {lo:g}" if above else f">= {lo:g}"
    if hi in (math.inf, INT64_MAX, FLOAT32_MAX):
        return low
    if lo in (-math.inf, INT64_MIN, -FLOAT32_MAX):
        return f"<= {hi:g}"
    return f"{low} and <= {hi:g}"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)
