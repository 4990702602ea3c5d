"""The engines as users reach them: ``skyrl rollout --engine hf`` through the installed plugin."""

from __future__ import annotations

import json


def test_rollout_with_the_hf_engine_writes_token_exact_trajectories(skyrl_cli, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "hf", "--model", "tiny-random",
                       "--n-tasks", "2", "--samples", "2", "--out", str(out), "generator.max_tokens_per_turn=8")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert len(row["response_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
        assert all(lp < 0 for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True) if m == 1)


def test_rollout_with_an_unavailable_model_fails_with_a_message(skyrl_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "hf", "--model", "some-org/missing-model",
                       "--out", str(tmp_path / "r.jsonl"))
    assert result.exit_code == 2  # the CLI's usage/config error code
    assert "'some-org/missing-model'" in result.output and "tiny-random" in result.output
    assert "Traceback" not in result.output
