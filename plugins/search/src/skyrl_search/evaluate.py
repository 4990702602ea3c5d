"""``skyrl-search eval``: Search-R1's results table from the trajectories of a ``search`` rollout.

Run the model first, then tabulate::

    skyrl rollout --env search --model MODEL --split test --n-tasks 0 --out rollouts.jsonl
    skyrl-search eval rollouts.jsonl

Each trajectory record carries its task row (``task.data_source``) and the env's per-episode
metrics (``metrics.em``, ``f1``, ``answered``, ``searches``). The table has one row per data source
and an ``Average`` row that, like the published table, is the unweighted mean over data sources.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from skyrl_core.trajectory import read_jsonl

COLUMNS = ("em", "f1", "answered", "searches")
HEADERS = {"em": "EM", "f1": "F1", "answered": "answer rate", "searches": "searches"}


@dataclass(frozen=True)
class SourceScores:
    """Means over the episodes of one data source (or, for ``Average``, over the sources)."""

    data_source: str
    episodes: int
    em: float
    f1: float
    answered: float
    searches: float


@dataclass(frozen=True)
class EvalTable:
    rows: list[SourceScores]
    average: SourceScores

    def format(self) -> str:
        """The table as aligned plain text, one line per data source, then the average."""
        width = max(len("data source"), *(len(r.data_source) for r in [*self.rows, self.average]))
        lines = [f"{'data source':<{width}}  {'episodes':>8}" + "".join(f"  {HEADERS[c]:>11}" for c in COLUMNS)]
        for row in [*self.rows, self.average]:
            values = "".join(f"  {getattr(row, c):>11.3f}" for c in COLUMNS)
            lines.append(f"{row.data_source:<{width}}  {row.episodes:>8}{values}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"rows": [asdict(r) for r in self.rows], "average": asdict(self.average)}


def em_table(trajectories_jsonl: str | Path) -> EvalTable:
    """Scores per data source of the episodes in a ``skyrl rollout --env search`` JSONL file.

    Step-wise files hold one record per turn; only each episode's last step is counted. A record
    without the search env's metrics raises ValueError naming the file and the record.
    """
    path = Path(trajectories_jsonl)
    if not path.is_file():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    by_source: dict[str, list[dict[str, float]]] = {}
    for number, trajectory in enumerate(read_jsonl(path), start=1):
        if not trajectory.is_last_step:
            continue
        missing = [c for c in COLUMNS if c not in trajectory.metrics]
        if missing:
            raise ValueError(f"{path} record {number}: no {', '.join(missing)} metric(s); expected trajectories "
                             "written by `skyrl rollout --env search`")
        source = str(trajectory.task.get("data_source") or "unknown")
        by_source.setdefault(source, []).append(trajectory.metrics)
    if not by_source:
        raise ValueError(f"{path} holds no trajectories")
    rows = [SourceScores(source, len(episodes), *(sum(e[c] for e in episodes) / len(episodes) for c in COLUMNS))
            for source, episodes in sorted(by_source.items())]
    average = SourceScores("Average", sum(r.episodes for r in rows),
                           *(sum(getattr(r, c) for r in rows) / len(rows) for c in COLUMNS))
    return EvalTable(rows, average)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="skyrl-search eval",
        description="EM, F1, answer rate and searches per data source, from the JSONL written by "
                    "`skyrl rollout --env search --out FILE`.")
    parser.add_argument("trajectories", type=Path, help="The rollout's JSONL file.")
    parser.add_argument("--json", action="store_true", help="Print the table as JSON.")
    args = parser.parse_args(argv)
    try:
        table = em_table(args.trajectories)
    except (FileNotFoundError, ValueError) as error:
        parser.exit(2, f"skyrl-search eval: {error}\n")
    print(json.dumps(table.to_dict(), indent=2) if args.json else table.format())
    return 0
