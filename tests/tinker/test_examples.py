"""The README's example loops run against the server: SL loss falls and answers are learned; RL reward rises."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "tinker" / "examples"


def _load(name: str):
    """The example as a module; its folder is on ``sys.path`` while it loads, as when it runs as a script (the
    examples import their shared ``_common.py`` as a sibling)."""
    spec = importlib.util.spec_from_file_location(f"tinker_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@pytest.mark.parametrize("name", ["sl_loop", "rl_loop"])
def test_examples_run_as_scripts_find_their_shared_module(name, tmp_path):
    """``python tinker/examples/<name>.py``, as the README runs them, from any folder."""
    result = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--base-url" in result.stdout and "--base-model" in result.stdout and "--steps" in result.stdout


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
