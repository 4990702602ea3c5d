"""The reward of one verification, read from the reward file the tests wrote, with rewards as Harbor keeps them.

Harbor keeps a verifier's result as a dict of named numbers (``rewards: dict[str, float | int]``):
``reward.txt`` (one number) is ``{"reward": x}``, ``reward.json`` an object of numbers. Harbor
defines no single number for several keys (its built-in ``mean`` metric refuses a dict with more
than one key; a dataset brings its own metric), so the scalar a trainer needs is our rule:

1. a ``reward`` key, when present, is the reward; the other keys are only logged;
2. otherwise the weighted mean of the keys. The weights are ``env.reward_weights``, else the
   task's ``[metadata.skyrl] reward_weights``, else equal weights over the keys present. A weighted
   key missing from the file counts 0 (the problem says so); keys without a weight are logged with
   weight 0.

Every value is clipped to [0, 1] before it is combined or logged (the reward stays in [0, 1] and
the per-key metrics stay comparable); a clip of a value that counts is named in the problem. A
value that counts but is not a finite number (text, null, true/false, ``NaN``, ``1e400``) counts 0
and the problem names its key; such a value of a key that is only logged is left out. A nested
object or array, a duplicate key, or a top level that is neither an object nor a number (a bare
number is read as ``{"reward": x}``) refuse the whole file: reward 0. At most :data:`MAX_KEYS`
keys are logged (the counting ones first), their names made safe for metric names
(:data:`KEY_PATTERN`, at most :data:`MAX_KEY_CHARS` characters); the reward uses every key.

Everything here is a pure function of the file's bytes and the weights.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_KEYS = 32
MAX_KEY_CHARS = 64
KEY_PATTERN = r"[A-Za-z0-9_.-]"
REWARD_KEY = "reward"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_NOTES = 4
_MAX_INT_DIGITS = 300  # longer integers are read as floats (infinite ones are not finite), never as huge ints


@dataclass(frozen=True)
class RewardReading:
    """What one reward file says: the reward in [0, 1], where it came from, why it is 0 or changed, each key."""

    reward: float
    source: str | None  # "reward.txt" or "reward.json"; None when no reward could be read
    problem: str | None
    rewards: dict[str, float] = field(default_factory=dict)  # metric-safe key -> value in [0, 1]


def weights_problem(weights: Mapping[str, Any]) -> str | None:
    """Why ``weights`` (key -> weight) cannot weight a reward dict, or None: finite numbers >= 0, one above 0."""
    if not isinstance(weights, Mapping) or not weights:
        return "must be a non-empty table of key = weight"
    for key, weight in weights.items():
        if not isinstance(key, str) or not key:
            return f"has a key {key!r} that is not a non-empty string"
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            return f"{key} must be a finite number >= 0, got {type(weight).__name__} {weight!r}"
    if not any(weight > 0 for weight in weights.values()):
        return "needs at least one weight above 0"
    return None


def parse_reward(reward_txt: bytes | None, reward_json: bytes | None,
                 weights: Mapping[str, float] | None = None) -> RewardReading:
    """The reward of ``reward.txt`` when the tests wrote one, else of ``reward.json`` (see the module's rule)."""
    if reward_txt is not None:
        text = reward_txt.decode("utf-8", "replace").strip()
        try:
            value = float(text)
        except ValueError:
            return RewardReading(0.0, None, f"/logs/verifier/reward.txt does not hold a number: {text[:80]!r}")
        if not math.isfinite(value):
            return RewardReading(0.0, None, f"reward.txt holds {value}, not a finite number")
        clipped = _clip(value)
        problem = f"reward.txt holds {value:g}, clipped to [0, 1]" if clipped != value else None
        return RewardReading(clipped, "reward.txt", problem, {REWARD_KEY: clipped})
    if reward_json is not None:
        return _parse_json(reward_json, weights)
    return RewardReading(0.0, None, "the tests wrote no /logs/verifier/reward.txt or reward.json")


class _Refused(ValueError):
    """A reward.json that is refused as a whole."""


def _parse_json(data: bytes, weights: Mapping[str, float] | None) -> RewardReading:
    try:
        top = json.loads(data, object_pairs_hook=_unique_keys, parse_int=_parse_int)
    except _Refused as exc:
        return RewardReading(0.0, None, f"/logs/verifier/reward.json is refused: {exc}")
    except RecursionError:
        return RewardReading(0.0, None, "/logs/verifier/reward.json is refused: it is nested too deeply")
    except ValueError as exc:  # JSONDecodeError, and bytes that are not UTF-8/16/32
        return RewardReading(0.0, None, f"/logs/verifier/reward.json is not JSON: {exc}")
    if isinstance(top, int | float) and not isinstance(top, bool):
        top = {REWARD_KEY: top}
    if not isinstance(top, dict):
        return RewardReading(0.0, None, f"/logs/verifier/reward.json is refused: its top level is a "
                                        f"{type(top).__name__}, not an object of named numbers")
    nested = [key for key, value in top.items() if isinstance(value, dict | list)]
    if nested:
        return RewardReading(0.0, None, f"/logs/verifier/reward.json is refused: key {nested[0][:80]!r} holds "
                                        f"a nested {'object' if isinstance(top[nested[0]], dict) else 'array'}, "
                                        "and rewards are plain numbers")
    if not top:
        return RewardReading(0.0, None, "/logs/verifier/reward.json is an empty object: no reward")
    return _combine(top, weights)


def _combine(values: dict[str, Any], weights: Mapping[str, float] | None) -> RewardReading:
    """The reward of a flat dict by the module's rule."""
    if REWARD_KEY in values:
        counted: dict[str, float] = {REWARD_KEY: 1.0}
    elif weights:
        counted = {key: float(weight) for key, weight in weights.items() if weight > 0}
    else:
        counted = dict.fromkeys(values, 1.0)
    notes: list[str] = []
    usable: dict[str, float] = {}
    for key in counted:
        if key not in values:
            notes.append(f"the weighted key {key[:80]!r} is missing: it counts 0")
            usable[key] = 0.0
            continue
        value, note = _value(key, values[key])
        usable[key] = 0.0 if value is None else value
        if note:
            notes.append(note)
    total = sum(counted.values())
    reward = _clip(sum(weight * usable[key] for key, weight in counted.items()) / total)
    logged = dict(usable)
    for key, raw in values.items():
        if key not in logged:
            value, _ = _value(key, raw)
            if value is not None:
                logged[key] = value
    rewards = _metric_names(logged)
    if len(logged) > MAX_KEYS:
        notes.append(f"reward.json has {len(logged)} keys: only the first {MAX_KEYS} are logged")
    if len(notes) > _MAX_NOTES:
        notes = notes[:_MAX_NOTES] + [f"and {len(notes) - _MAX_NOTES} more"]
    return RewardReading(reward, "reward.json", "; ".join(notes) or None, rewards)


def _value(key: str, raw: Any) -> tuple[float | None, str | None]:
    """The value in [0, 1] (None: unusable, it counts 0) and a note when it was unusable or clipped."""
    name = repr(key[:80])
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None, f"reward.json key {name} holds {type(raw).__name__} {str(raw)[:40]!r}, not a number: it counts 0"
    value = float(raw)
    if not math.isfinite(value):
        return None, f"reward.json key {name} holds {value}, not a finite number: it counts 0"
    clipped = _clip(value)
    return clipped, (f"reward.json key {name} holds {value:g}, clipped to [0, 1]" if clipped != value else None)


def _metric_names(values: dict[str, float]) -> dict[str, float]:
    """The first :data:`MAX_KEYS` entries under names safe in a metric (``reward/<name>``), each name unique."""
    named: dict[str, float] = {}
    for key, value in values.items():
        if len(named) >= MAX_KEYS:
            break
        base = (_UNSAFE.sub("_", key) or "_")[:MAX_KEY_CHARS]
        name, suffix = base, 1
        while name in named:
            suffix += 1
            name = f"{base[:MAX_KEY_CHARS - len(str(suffix)) - 1]}_{suffix}"
        named[name] = value
    return named


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"the key {key[:80]!r} appears twice")
        result[key] = value
    return result


def _parse_int(text: str) -> int | float:
    return float(text) if len(text.lstrip("-")) > _MAX_INT_DIGITS else int(text)


def _clip(value: float) -> float:
    return min(max(value, 0.0), 1.0)
