"""Metrics logging to JSONL, console and (offline) Weights & Biases."""

from __future__ import annotations

import json

import pytest
from skyrl_core.metrics import MetricsLogger


def test_jsonl_and_console(tmp_path, capsys):
    with MetricsLogger(tmp_path / "run", console=True) as logger:
        logger.log(1, {"reward/mean": 0.25, "loss": float("nan")})
        logger.log(2, {"reward/mean": 0.5})
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in lines] == [(1, 0.25), (2, 0.5)]
    assert lines[0]["loss"] is None  # NaN is written as null so the file stays valid JSON
    assert "reward/mean" in capsys.readouterr().err


@pytest.mark.slow
def test_wandb_runs_offline_without_an_api_key(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with MetricsLogger(tmp_path, console=False, wandb_project="skyrl-test", config={"a": 1}) as logger:
        logger.log(1, {"reward/mean": 1.0})
    assert list((tmp_path / "wandb").glob("offline-run-*"))
