"""Catalogue sweep: every reasoning-gym dataset makes its first row offline, its prompt builds and its gold answer
scores its declared ceiling (about 10 s for the ~106 datasets)."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("reasoning_gym")

from skyrl_bridge_reasoning_gym import peer  # noqa: E402
from skyrl_bridge_reasoning_gym.catalog import OPEN_ENDED  # noqa: E402
from skyrl_bridge_reasoning_gym.sweep import summary, sweep  # noqa: E402


def test_every_dataset_makes_its_first_row_offline_and_its_gold_scores_its_ceiling(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("reasoning-gym tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    peer._rows.cache_clear()
    peer._dataset.cache_clear()
    results = sweep()
    totals = summary(results)
    print(totals)
    assert totals["failed"] == {}
    assert totals["datasets"] == len(peer.dataset_names()) == totals["made"]
    assert set(totals["open_ended"]) == OPEN_ENDED  # the catalogue's tags say which datasets have no gold
    assert totals["with_gold"] == totals["made"] - len(OPEN_ENDED)
    assert totals["gold_below_1"] == []  # at the default options, every first row's own answer scores 1
