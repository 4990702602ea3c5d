"""Everything that touches reasoning-gym: its registry, its datasets (built once per config), its rows and scores.

Every call into the peer goes through :func:`peer_call`, which runs it under
:func:`skyrl_core.peer_rng.global_rng_kept`: one process-wide lock, and the process's global ``random`` and
``numpy.random`` states put back as they were (the peer seeds its own ``random.Random`` per item, but some
datasets seed numpy's global generator: ``pool_matrix`` calls ``np.random.seed``, and a training process must not
have its sampling reseeded by a dataset). :func:`score` with ``timeout_s`` runs the scorer in a forked child
instead (:mod:`skyrl_bridge_reasoning_gym.sandbox`): for the scorers that evaluate the model's answer as Python.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

from skyrl_core.peer_rng import global_rng_kept
from skyrl_core.registry import did_you_mean

from skyrl_bridge_reasoning_gym.sandbox import call_in_child

T = TypeVar("T")

COMPOSITE = "composite"
DEFAULT_SEED = 0
DEFAULT_TRAIN_SIZE = 64
DEFAULT_TEST_SIZE = 16
TEST_SEED_OFFSET = 2**30
"""The test split's dataset seed is the train seed plus (or, past 2**31, minus) this: most datasets draw item ``i``
from ``Random(seed + i)``, so the two splits' item seeds never meet; rows whose question is also a train question
are dropped on top of that."""
MAX_SEED = 2**32 - 1 - 2 * TEST_SEED_OFFSET  # numpy's seed (pool_matrix seeds it with seed + index) stays < 2**32
MAX_ROWS = 100_000


class DatasetUnavailable(RuntimeError):
    """A reasoning-gym dataset cannot be built here (a data file, a module or a download it needs is missing)."""


def peer_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under :func:`skyrl_core.peer_rng.global_rng_kept` (the peer lock; the global RNG
    states put back afterwards)."""
    with global_rng_kept():
        return fn(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registered datasets: ``name -> (dataset class, config dataclass)`` (importing the peer)."""
    def load() -> dict[str, tuple[type, type]]:
        import reasoning_gym  # noqa: F401 - registers every dataset
        from reasoning_gym.factory import DATASETS

        return dict(DATASETS)
    return peer_call(load)


def dataset_names() -> list[str]:
    return sorted(registry())


def check_name(name: str) -> str:
    names = registry()
    if name not in names:
        raise ValueError(f"unknown reasoning-gym dataset {name!r}.{did_you_mean(name, sorted(names))} "
                         f"`skyrl envs --catalog reasoning_gym` lists the {len(names)} datasets")
    return name


def option_names(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(registry()[check_name(name)][1])]


# -- config validation ---------------------------------------------------------------------------------


def validate_args(name: str, args: Mapping[str, Any], where: str = "env.args") -> dict[str, Any]:
    """Check ``args`` against dataset ``name``'s config dataclass; the values as the dataclass holds them.

    Unknown keys name the key (with a did-you-mean) and the dataset's options; values are checked by type
    (pydantic, from the dataclass's annotations), then by the dataset's own ``validate()``.
    """
    if check_name(name) == COMPOSITE:
        from skyrl_bridge_reasoning_gym.composite import validate_composite_args

        return validate_composite_args(args, where)
    allowed = option_names(name)
    for key in args:
        if key not in allowed:
            raise ValueError(f"{where}.{key}: unknown option of reasoning-gym dataset {name!r}."
                             f"{did_you_mean(str(key), allowed)} Its options: {', '.join(allowed)}")
    _check_seed_and_size(args, where)
    config = build_config(name, args, where)
    return {key: getattr(config, key) for key in args}


def _check_seed_and_size(args: Mapping[str, Any], where: str) -> None:
    """``seed`` and ``size`` make the built-in rows: the train split's seed and row count."""
    for key, low, high in (("seed", 0, MAX_SEED), ("size", 1, MAX_ROWS)):
        value = args.get(key)
        if value is None and (key == "seed" or key not in args):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{where}.{key}: must be a whole number from {low} to {high:,} (the built-in train "
                             f"rows' {'seed' if key == 'seed' else 'count'}), got {value!r}")


def build_config(name: str, args: Mapping[str, Any], where: str = "env.args") -> Any:
    """The dataset's config dataclass built from ``args``, validated (errors name ``where.key``)."""
    from pydantic import TypeAdapter, ValidationError

    config_cls = registry()[name][1]
    try:
        config = TypeAdapter(config_cls).validate_python(dict(args))
    except ValidationError as exc:
        problems = "; ".join(f"{where}.{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})"
                             for err in exc.errors())
        raise ValueError(f"invalid options for reasoning-gym dataset {name!r}: {problems}") from None
    if callable(getattr(config, "validate", None)):
        try:
            peer_call(config.validate)
        except (AssertionError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: reasoning-gym dataset {name!r} rejected its options: "
                             f"{exc or type(exc).__name__}") from None
    return config


# -- datasets and rows -----------------------------------------------------------------------------------


def split_seed(base: int, split: str) -> int:
    """The dataset seed of ``split``'s rows (``train``: the base seed itself)."""
    if split == "train":
        return base
    if split == "test":
        return base + TEST_SEED_OFFSET
    raise ValueError(f"reasoning_gym has the splits 'train' and 'test', not {split!r}")


def _key(name: str, options: Mapping[str, Any]) -> str:
    return json.dumps([name, to_jsonable(dict(options))], sort_keys=True)


def dataset(name: str, options: Mapping[str, Any]) -> Any:
    """The peer's dataset ``name`` built with ``options`` (its config's fields, ``seed`` and ``size`` included),
    cached per process; a dataset that cannot be built offline raises :class:`DatasetUnavailable`."""
    return _dataset(_key(name, options))


@functools.lru_cache(maxsize=64)
def _dataset(key: str) -> Any:
    name, options = json.loads(key)
    dataset_cls = registry()[check_name(name)][0]
    if name == COMPOSITE:
        from skyrl_bridge_reasoning_gym.composite import peer_composite_config

        config = peer_composite_config(options)
    else:
        config = build_config(name, options)
    try:
        return peer_call(dataset_cls, config=config)
    except (ImportError, OSError) as exc:
        raise DatasetUnavailable(_unavailable(name, exc)) from exc


def _unavailable(name: str, exc: BaseException) -> str:
    what = (f"the module {exc.name!r} is not installed" if isinstance(exc, ImportError) and exc.name
            else f"{type(exc).__name__}: {exc}")
    return (f"reasoning-gym dataset {name!r} cannot be built offline: {what}. The bridge never downloads; "
            f"install what it needs (or ship the data file in the reasoning-gym package, or name one that exists "
            f"in env.args) and try again")


def entry(name: str, options: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Item ``index`` of the dataset, as the peer makes it (not JSON-cleaned: its score_answer reads it)."""
    ds = dataset(name, options)
    try:
        return peer_call(ds.__getitem__, index)
    except (ImportError, OSError) as exc:
        raise DatasetUnavailable(_unavailable(name, exc)) from exc


def score(name: str, options: Mapping[str, Any], answer: str | None, item: Mapping[str, Any],
          timeout_s: float | None = None) -> float:
    """The peer's ``score_answer(answer, item)``, as a finite float clipped to [0, 1].

    With ``timeout_s``, it runs in a forked child with memory and CPU limits and that wall-clock limit
    (:func:`skyrl_bridge_reasoning_gym.sandbox.call_in_child`, which raises ``ChildFailed`` when the child is
    stopped or dies and ``ChildRaised`` when the scorer raises); without, in this process.
    """
    ds = dataset(name, options)
    if timeout_s is None:
        value = float(peer_call(ds.score_answer, answer, dict(item)))
    else:
        value = call_in_child(ds.score_answer, answer, dict(item), timeout_s=timeout_s)
    if not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), 1.0)


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: tuples and sets as lists, dataclasses as dicts, Fractions and other
    objects as their ``str`` (rows must survive a JSON file and a trip to another process)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((to_jsonable(v) for v in value), key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Fraction):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return to_jsonable(value.tolist())
    return str(value)


def make_rows(name: str, args: Mapping[str, Any], split: str, test_size: int) -> list[dict[str, Any]]:
    """The built-in rows of ``split`` (cached per process): see :func:`_rows`."""
    return [dict(row) for row in _rows(_key(name, args), split, test_size)]


@functools.lru_cache(maxsize=32)
def _rows(key: str, split: str, test_size: int) -> tuple[dict[str, Any], ...]:
    name, args = json.loads(key)
    base = args.get("seed")
    base = DEFAULT_SEED if base is None else int(base)
    train_size = int(args.get("size") or DEFAULT_TRAIN_SIZE)
    if split == "train":
        return tuple(make_row(name, args, "train", base, i, size=train_size) for i in range(train_size))
    if split != "test":
        split_seed(base, split)  # raises the error naming the splits
    seen = {row["question"] for row in _rows(key, "train", test_size)}
    rows: list[dict[str, Any]] = []
    index = 0
    limit = max(4 * test_size, test_size + 64)
    while len(rows) < test_size and index < limit:
        row = make_row(name, args, "test", base, index, size=limit)
        index += 1
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    if len(rows) < test_size:
        warnings.warn(f"reasoning-gym dataset {name!r}: only {len(rows)} of {test_size} test questions differ from "
                      f"every train question in {index} tries (its options allow few distinct questions)",
                      UserWarning, stacklevel=2)
    return tuple(rows)


def make_row(name: str, args: Mapping[str, Any], split: str, base: int, index: int, size: int) -> dict[str, Any]:
    """Row ``index`` of ``split`` for train seed ``base``, made by a dataset of ``size`` items."""
    options = {**args, "seed": split_seed(base, split), "size": size}
    item = entry(name, options, index)
    metadata = item.get("metadata") or {}
    source = metadata.get("source_dataset", name) if isinstance(metadata, Mapping) else name
    return {
        "name": f"{name}-{split}-{index}",
        "dataset": name,
        "source_dataset": str(source),
        "split": split,
        "index": index,
        "question": str(item["question"]),
        "answer": None if item.get("answer") is None else str(item["answer"]),
        "metadata": to_jsonable(metadata),
        # How to make the peer's own entry again (its metadata may hold tuples or Fractions that JSON changes,
        # and some datasets score against those): dataset name, its options, the item's index.
        "source": {"dataset": name, "options": to_jsonable(options), "index": index},
    }
