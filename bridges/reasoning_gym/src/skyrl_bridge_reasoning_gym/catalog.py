"""The catalogue: every dataset registered in reasoning-gym, one entry each (names read from the peer's registry)."""

from __future__ import annotations

import re

from skyrl_core.catalog import CatalogEntry

from skyrl_bridge_reasoning_gym import peer

OPEN_ENDED = frozenset({"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"})
"""Datasets whose entries have no answer (``answer`` is ``None``): ``score_answer`` checks any solution, so their
tasks have no gold action (the catalogue sweep test checks this list against the peer)."""
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def _about(dataset_cls: type) -> str:
    doc = (dataset_cls.__doc__ or "").strip()
    first = doc.splitlines()[0].strip() if doc else ""
    return _LINK.sub(r"\1", first).rstrip(".")


def entries() -> list[CatalogEntry]:
    registered = peer.registry()
    listed = []
    for name in sorted(registered):
        dataset_cls = registered[name][0]
        parts = dataset_cls.__module__.split(".")
        tags = [parts[1]] if len(parts) >= 3 else []
        if name in OPEN_ENDED:
            tags.append("open-ended: no gold answer")
        if name == peer.COMPOSITE:
            tags.append("needs env.args.datasets")
        about = _about(dataset_cls) or f"reasoning-gym's {name} dataset"
        listed.append(CatalogEntry(name, description=about, multi_turn=False, reward_range=(0.0, 1.0), max_turns=1,
                                   tags=tuple(tags)))
    return listed
