"""SkyRL's row format: built-in rows, data files (JSONL or parquet) and the checks each row must pass.

A SkyRL row is ``{"data_source", "prompt": [chat messages], "env_class", "reward_spec": {"method",
"ground_truth"}, "extra_info", ...}``; every field but ``prompt`` and ``env_class`` reaches the peer env as
its ``extras`` (as SkyRL's generator passes them). Rows are numbered from 1 in every message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_bridge_skyrl_gym.catalog import PEER_ENVS


class RowError(ValueError):
    """A row the named peer env cannot run; the message names the row."""


# Our own small word problems (written for this bridge): question, answer.
_PROBLEMS: dict[str, list[tuple[str, str]]] = {
    "train": [
        ("A baker fills 7 trays with 12 rolls each and sells 30 rolls. How many rolls are left?", "54"),
        ("Mia reads 15 pages a day for 6 days, then 9 pages on the seventh day. How many pages did she read?", "99"),
        ("A ticket costs 8 dollars. A class of 23 students and 2 teachers buys one ticket each. What do they pay?",
         "200"),
        ("A garden has 5 rows of 14 tulips. A storm breaks 17 of them. How many tulips are still standing?", "53"),
        ("Sam saves 25 dollars a week. After how many weeks does he have exactly 175 dollars?", "7"),
        ("A bus holds 48 people. 3 full buses and one with 19 people go on a trip. How many people go?", "163"),
    ],
    "test": [
        ("A box holds 9 pencils. How many pencils are in 11 boxes, after 4 pencils are lost?", "95"),
        ("Leo runs 3 km every morning and 2 km every evening. How many km does he run in 12 days?", "60"),
    ],
}

_INSTRUCTIONS = {
    "gsm8k": "Solve the problem step by step. End your reply with four hash signs, a space and the final number.",
    "gsm8k_multi_turn": "Solve the problem step by step. End each reply with four hash signs, a space and your "
                        "numeric answer.",
}


def builtin_rows(name: str, split: str) -> list[dict[str, Any]]:
    """The bridge's own rows for ``name`` (gsm8k and gsm8k_multi_turn only); ``split`` 'train' or 'test'."""
    if name not in _INSTRUCTIONS:
        raise RowError(f"skyrl-gym's {name!r} has no built-in rows in this bridge: give SkyRL rows with "
                       f"env.data_files.{split}=PATH (JSONL or parquet){needs_hint(name)}")
    if split not in _PROBLEMS:
        raise RowError(f"the built-in rows have no split {split!r}; they have: {', '.join(_PROBLEMS)}")
    return [{"id": f"{name}-{split}-{i}", "data_source": "skyrl_bridge_builtin",
             "prompt": [{"role": "user", "content": f"{question} {_INSTRUCTIONS[name]}"}],
             "env_class": name, "reward_spec": {"method": "rule", "ground_truth": answer},
             "extra_info": {"split": split, "index": i}}
            for i, (question, answer) in enumerate(_PROBLEMS[split], start=1)]


def needs_hint(name: str) -> str:
    known = PEER_ENVS.get(name)
    return f"; it also needs {known.needs}" if known and known.needs else ""


def load_rows(path: str | Path, name: str) -> list[dict[str, Any]]:
    """The rows of a JSONL or parquet file, each checked for ``name`` (a bad row raises, naming its number)."""
    path = Path(path)
    if not path.is_file():
        raise RowError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise RowError(f"{path} is parquet, which needs pyarrow: pip install 'skyrl-bridge-skyrl-gym[parquet]' "
                           f"(or give the rows as JSONL)") from None
        rows = pq.read_table(path).to_pylist()
    else:
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise RowError(f"{path}: line {number} is not JSON: {exc}") from None
    if not rows:
        raise RowError(f"{path} holds no rows")
    checked = []
    for number, row in enumerate(rows, start=1):
        problem = row_problem(row, name)
        if problem:
            raise RowError(f"{path}: row {number}: {problem}")
        checked.append(row)
    return checked


def row_problem(row: Any, name: str) -> str | None:
    """What makes ``row`` unplayable by skyrl-gym's ``name``, or None."""
    if not isinstance(row, Mapping):
        return f"expected an object, got {type(row).__name__}"
    env_class = row.get("env_class")
    if env_class is not None and env_class != name:
        return f"its env_class is {env_class!r} but env.name is {name!r} (one env per run: split the file)"
    prompt = row.get("prompt")
    if not (isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)):
        return "'prompt' must be a non-empty list of chat messages {role, content}"
    for dotted in PEER_ENVS[name].row_needs:
        value: Any = row
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is None or value == "" or value == []:
            return f"it has no {dotted!r}, which skyrl-gym's {name!r} needs"
    if name == "text2sql" and row.get("data") not in ("synsql", "spider", "bird"):
        return f"its 'data' is {row.get('data')!r}; skyrl-gym's text2sql knows 'synsql', 'spider' and 'bird'"
    return None
