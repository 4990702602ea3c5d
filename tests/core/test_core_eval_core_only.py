"""The quick evaluation path: with only ``skyrl-core`` and an env plugin installed (no transformers, no
torch), ``skyrl rollout --engine openai engine.mode=chat`` evaluates the env against a real
OpenAI-compatible server on loopback (``transformers serve``, run from the workspace venv) and prints
the reward summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers_serve import serve_tiny_random

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_rollout_in_chat_mode_with_only_skyrl_core_installed(fresh_venv, tmp_path):
    fresh_venv.install(REPO / "core", REPO / "examples" / "reverse_text")
    packages = fresh_venv.packages()
    assert {"skyrl-core", "skyrl-reverse-text"} <= packages
    assert not {"transformers", "torch", "skyrl-trainers"} & packages
    out = tmp_path / "eval.jsonl"
    with serve_tiny_random(tmp_path / "server") as served:
        result = fresh_venv.skyrl("rollout", "--env", "reverse_text", "--engine", "openai", "--n-tasks", "3",
                                  "--samples", "2", "--out", str(out), f"engine.base_url={served.base_url}",
                                  "engine.mode=chat", "generator.max_tokens_per_turn=40", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rollout summary" in result.stdout and "reward/mean" in result.stdout
    assert "wrote 6 trajectories" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 and all(r["error"] is None for r in records)
    assert all(turn["token_source"] == "text" for r in records for turn in r["turns"])
