"""The README's example loops run against the server: SL loss falls and answers are learned; RL reward rises."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "tinker" / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"tinker_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sl_example_learns(service_client, capsys):
    losses = _load("sl_loop").train(service_client, "tiny-random", steps=30, lr=1e-2)
    assert losses[-1] < 0.1 * losses[0]
    assert "-> 'Paris.'" in capsys.readouterr().out


def test_rl_example_reward_rises(service_client):
    history = _load("rl_loop").train(service_client, "tiny-random", steps=20, group=8, max_tokens=8, lr=1e-2)
    assert statistics.fmean(history[-5:]) > statistics.fmean(history[:5]) + 0.3, history


def test_rl_example_takes_rewards_from_an_env(service_client):
    pytest.importorskip("skyrl_reverse_text")
    from skyrl_trainers.models import load_tokenizer

    rl = _load("rl_loop")
    tokenizer = load_tokenizer("tiny-random")
    task = rl.EnvTask(tokenizer, "reverse_text", n_prompts=2)
    text = task.tasks[0]["text"]
    right = tokenizer.encode(f"<answer>{text[::-1]}</answer>", add_special_tokens=False)
    assert task.reward(0, right) == 1.0 and task.reward(0, tokenizer.encode("no tags")) == 0.0
    history = rl.train(service_client, "tiny-random", steps=1, group=2, max_tokens=4, lr=1e-2, env="reverse_text")
    assert len(history) == 1
