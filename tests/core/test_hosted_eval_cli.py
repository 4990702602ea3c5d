"""Evaluating a hosted model from the command line, against a real OpenAI-compatible server on loopback
(tests/core/openai_server.py): ``--engine openai --model NAME`` plays in chat mode without being told
(a hosted model's name gives no tokenizer) and says so in one line; an unreachable server or a refused
key stops ``skyrl eval`` and ``skyrl rollout`` before any episode, naming the URL, with no results folder
and no output file left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai_server import OpenAIServer, error_fault, unused_port
from skyrl_core.engines.openai import OpenAIEngine, OpenAIEngineError

SKYRL = Path(sys.executable).with_name("skyrl")
MODEL = "some-hosted-model"


class ReversingServer(OpenAIServer):
    """A chat server whose "model" solves reverse_text: the user's text reversed, inside answer tags."""

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        text = next(m["content"] for m in body["messages"] if m["role"] == "user")
        self.chat_replies.append(f"<answer>{text[::-1]}</answer>")
        return super()._chat(body)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with ReversingServer(None, models=[MODEL]) as srv:
        yield srv


def skyrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80", "OPENAI_API_KEY": "sk-test-key"}
    return subprocess.run([str(SKYRL), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_eval_of_a_hosted_model_picks_chat_mode_and_says_so(server, tmp_path):
    out = tmp_path / "results"
    result = skyrl("eval", "--env", "reverse_text", "--engine", "openai", "--model", MODEL, "--n-tasks", "3",
                   "--out", str(out), f"engine.base_url={server.url}", "generator.temperature=0", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    notes = [line for line in result.stderr.splitlines() if "chat mode" in line]
    assert len(notes) == 1 and "engine.tokenizer" in notes[0], result.stderr
    assert "eval summary" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval/pass@1"] == 1.0 and metrics["eval/tasks"] == 3
    assert yaml.safe_load((out / "config.yaml").read_text())["engine"]["mode"] == "chat"
    chats = server.requests_to("/v1/chat/completions")
    assert len(chats) == 3 and all(r.body["model"] == MODEL for r in chats)
    assert all(r.headers["authorization"] == "Bearer sk-test-key" for r in server.requests)
    assert not server.requests_to("/v1/completions")


def test_print_config_shows_the_chat_mode_an_eval_would_use(tmp_path):
    result = skyrl("eval", "--env", "reverse_text", "--engine", "openai", "--model", MODEL, "--print-config",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["engine"]["mode"] == "chat" and "chat mode" in result.stderr


def test_completions_mode_without_a_tokenizer_points_to_chat_mode(server, tmp_path):
    result = skyrl("rollout", "--env", "reverse_text", "--engine", "openai", "--model", MODEL,
                   f"engine.base_url={server.url}", "engine.mode=completions", cwd=tmp_path)
    assert result.returncode == 2
    assert "engine.tokenizer=" in result.stderr and "engine.mode=chat" in result.stderr
    assert not server.requests and not (tmp_path / "rollouts.jsonl").exists()


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_an_unreachable_server_stops_before_any_episode_naming_the_url(command, tmp_path):
    base_url = f"http://127.0.0.1:{unused_port()}/v1"
    out = tmp_path / ("results" if command == "eval" else "rollouts.jsonl")
    result = skyrl(command, "--env", "reverse_text", "--engine", "openai", "--model", MODEL, "--out", str(out),
                   f"engine.base_url={base_url}", cwd=tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{base_url}/models" in errors[0] and "cannot reach" in errors[0], result.stderr
    assert "summary" not in result.stdout and "reward" not in result.stdout  # no table of zeros
    assert not out.exists() and not (tmp_path / "evals").exists()


def test_a_refused_api_key_stops_eval_before_any_episode(server, tmp_path):
    server.inject(error_fault(401, "Incorrect API key provided"))
    result = skyrl("eval", "--env", "reverse_text", "--engine", "openai", "--model", MODEL,
                   f"engine.base_url={server.url}", cwd=tmp_path)
    assert result.returncode != 0
    assert f"HTTP 401 Unauthorized from GET {server.url}/models" in result.stderr
    assert "OPENAI_API_KEY" in result.stderr and "Incorrect API key provided" in result.stderr
    assert not server.requests_to("/v1/chat/completions") and not (tmp_path / "evals").exists()


async def test_preflight_is_one_request_that_also_finds_the_served_model(server):
    async with OpenAIEngine({"base_url": server.url, "mode": "chat"}) as engine:
        await engine.preflight()
        assert await engine.model_name() == MODEL
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")]
    url = f"http://127.0.0.1:{unused_port()}/v1"
    async with OpenAIEngine({"base_url": url, "model": MODEL, "max_retries": 5, "backoff_base_s": 30}) as engine:
        with pytest.raises(OpenAIEngineError, match=f"cannot reach GET {url}/models"):
            await engine.preflight()  # at once: no retries, no backoff
