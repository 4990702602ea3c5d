"""The ``openai`` engine against a strict third-party OpenAI-compatible server (``transformers serve``):
vendor fields the server rejects are learnt and left out, ids are marked exact or re-tokenised, chat
mode needs no tokenizer and its trajectories are refused by training, and a rollout whose every
episode failed exits non-zero."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from openai_server import Completion, Fault, OpenAIServer, error_fault
from skyrl_core.chat import ChatRenderer
from skyrl_core.engine import EngineError, SamplingParams
from skyrl_core.engines.openai import ChatTextCodec, OpenAIEngine, OpenAIStatusError
from skyrl_core.engines.retry import rejected_fields
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_core.trajectory import Trajectory, TrajectoryBatch, Turn
from transformers_serve import ServedModel, serve_tiny_random

TASKS = [{"id": str(i), "text": word} for i, word in enumerate(["apple", "river"])]


@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    """``transformers serve`` on ``tiny-random``, shared by the module."""
    with serve_tiny_random(tmp_path_factory.mktemp("served")) as served:
        yield served


def engine_for(served: Any, **options: Any) -> OpenAIEngine:
    return OpenAIEngine({"base_url": served.base_url, "max_retries": 0, **options},
                        tokenizer=None if options.get("mode") == "chat" else served.tokenizer)


def rejection_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rejects request field" in r.getMessage()]


# --- against transformers serve ------------------------------------------------------------------

async def test_completions_learn_the_rejected_vendor_fields_once_and_mark_ids_retokenised(served_model, caplog):
    tok = served_model.tokenizer
    prompt = list(tok.encode("Reverse: apple", add_special_tokens=False))
    params = SamplingParams(max_tokens=6, temperature=0.0, top_k=5, stop=["\n"], stop_token_ids=[tok.eos_token_id])
    caplog.set_level(logging.WARNING, "skyrl_core.engines.openai")
    async with engine_for(served_model) as engine:
        first = await engine.generate(prompt, params)
        warnings_after_first = len(caplog.records)
        second = await engine.generate(prompt, params)
        rejected = engine.rejected_fields["/completions"]
    assert {"return_tokens_as_token_ids", "stop_token_ids", "top_k", "include_stop_str_in_output"} <= rejected
    assert "max_tokens" not in rejected and "temperature" not in rejected
    assert len(caplog.records) == warnings_after_first, "the second request relearnt what the first one learnt"
    assert any("does not take prompts as token ids" in r.getMessage() for r in caplog.records)
    for out in (first, second):
        assert out.metadata["token_source"] == "retokenized" and out.metadata["retokenized"] is True
        assert 1 <= len(out.token_ids) <= 6 and out.logprobs is None
        assert all(0 <= i < len(tok) for i in out.token_ids)
    assert first.token_ids == second.token_ids  # greedy: the same continuation both times


async def test_chat_completions_drop_rejected_fields_and_return_the_reply(served_model, caplog):
    caplog.set_level(logging.WARNING, "skyrl_core.engines.openai")
    async with engine_for(served_model) as engine:
        reply = await engine.chat([{"role": "user", "content": "hello"}], max_tokens=5, top_k=3,
                                  repetition_penalty=1.1)
        again = await engine.chat([{"role": "user", "content": "hello"}], max_tokens=5, top_k=3,
                                  repetition_penalty=1.1)
        assert {"top_k", "repetition_penalty"} <= engine.rejected_fields["/chat/completions"]
    assert isinstance(reply, str) and isinstance(again, str)
    assert len(rejection_warnings(caplog)) == 1


async def test_completions_rollout_marks_turns_retokenised_but_trainable(served_model):
    async with engine_for(served_model) as engine:
        gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_tokens_per_turn=8, max_turns=1),
                                 engine=engine, tokenizer=served_model.tokenizer, env_id="reverse_text")
        batch = await gen.generate(TASKS)
    assert [t.error for t in batch] == [None, None]
    assert all(turn.token_source == "retokenized" for t in batch for turn in t.turns)
    assert all(t.token_source == "retokenized" and t.trainable for t in batch)


async def test_chat_mode_rollout_needs_no_tokenizer_and_marks_trajectories_untrainable(served_model, tmp_path):
    async with engine_for(served_model, mode="chat") as engine:
        assert isinstance(engine.tokenizer, ChatTextCodec)
        gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=2, max_tokens_per_turn=40),
                                 engine=engine, tokenizer=engine.tokenizer, env_id="reverse_text")
        batch = await gen.generate(TASKS)
        assert "stop_token_ids" not in engine.rejected_fields.get("/chat/completions", set())
    assert len(batch) == 4 and [t.error for t in batch] == [None] * 4
    for t in batch:
        assert t.token_source == "text" and not t.trainable
        # a random model never answers right: both turns are played, the whole conversation is kept
        assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "user", "assistant"]
        assert [m["content"] for m in t.messages if m["role"] == "assistant"] == [turn.action for turn in t.turns]
    batch.to_jsonl(tmp_path / "chat.jsonl")
    assert all(t.token_source == "text" and not t.trainable for t in TrajectoryBatch.from_jsonl(tmp_path / "chat.jsonl"))
    records = [json.loads(line) for line in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert [(r["token_source"], r["trainable"]) for r in records] == [("text", False)] * 4  # as documented
    # chat mode has no model tokens: lengths and speed are counted in characters, under names that say so
    chars = sum(len(turn.action) for t in batch for turn in t.turns)
    assert batch.metrics["rollout/response_chars_mean"] == chars / 4
    assert batch.metrics["rollout/generated_chars_per_second"] > 0
    assert not {"rollout/response_tokens_mean", "rollout/generated_tokens_per_second"} & set(batch.metrics)


def test_cli_rollout_in_chat_mode_prints_the_reward_summary(served_model, tmp_path, skyrl_cli):
    out = tmp_path / "eval.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "openai", "--n-tasks", "2", "--out", str(out),
                       f"engine.base_url={served_model.base_url}", "engine.mode=chat",
                       "generator.max_tokens_per_turn=40", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "rollout summary" in result.output and "reward/mean" in result.output
    assert "wrote 2 trajectories" in result.output and "rollout/response_chars_mean" in result.output
    assert "tokens" not in result.output  # no count of tokens where there are none
    assert all(not t.trainable for t in TrajectoryBatch.from_jsonl(out))


# --- training refuses chat-mode trajectories --------------------------------------------------------

def test_training_refuses_chat_mode_trajectories_with_a_clear_message():
    batching = pytest.importorskip("skyrl_trainers.batching")
    exact = Trajectory(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1], logprobs=[-0.5],
                       turns=[Turn(action="a", observation=[], generated_tokens=1)])
    chat = Trajectory(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1], logprobs=[0.0], id="chat1",
                      turns=[Turn(action="a", observation=[], generated_tokens=1, token_source="text")])
    assert len(batching.training_samples([exact], [1.0])) == 1
    with pytest.raises(batching.UntrainableTrajectoryError, match=r"1 of 2 trajectories \(e\.g\. chat1\).*chat text"
                       r".*openai engine's chat mode.*hf or vllm engine"):
        batching.training_samples([exact, chat], [1.0, -1.0])


# --- pieces, without a server --------------------------------------------------------------------

@pytest.mark.parametrize(("status", "message", "expected"), [
    (422, "Unexpected fields in the request: {'stop_token_ids', 'return_tokens_as_token_ids'}",
     {"stop_token_ids", "return_tokens_as_token_ids"}),
    (422, "[{'type': 'extra_forbidden', 'loc': ['body', 'top_k'], 'msg': 'Extra inputs are not permitted'}]",
     {"top_k"}),
    (400, "Unrecognized request argument supplied: seed", {"seed"}),
    (400, "max_tokens must be at least 1", set()),  # about a value, not an unknown field
    (500, "Unexpected fields in the request: {'top_k'}", set()),  # not a client error
    (422, "Unexpected fields in the request: {'something_not_sent'}", set()),
])
def test_rejected_fields_are_read_only_from_answers_that_name_sent_fields(status, message, expected):
    sent = {"model", "prompt", "max_tokens", "stop_token_ids", "return_tokens_as_token_ids", "top_k", "seed"}
    assert rejected_fields(status, message, sent) == expected


async def test_a_rejected_required_field_is_not_retried_and_the_error_names_it():
    tok = make_tokenizer("chatml")
    with OpenAIServer(tok, models=["m"]) as server:
        server.inject(error_fault(422, "Unexpected fields in the request: {'prompt'}"))
        async with OpenAIEngine({"base_url": server.url, "model": "m", "max_retries": 0}) as engine:
            with pytest.raises(OpenAIStatusError, match=r"HTTP 422.*Unexpected fields.*prompt"):
                await engine.generate([1, 2, 3], SamplingParams(max_tokens=2))
        assert len(server.requests_to("/v1/completions")) == 1


async def test_token_id_servers_keep_exact_ids_and_send_vendor_fields():
    tok = make_tokenizer("chatml")
    with OpenAIServer(tok, models=["m"], responder=lambda prompt: Completion([5, 6])) as server:
        async with OpenAIEngine({"base_url": server.url, "model": "m"}) as engine:
            out = await engine.generate([1, 2, 3], SamplingParams(max_tokens=4, stop_token_ids=[9]))
        body = server.requests_to("/v1/completions")[0].body
    assert out.token_ids == [5, 6] and out.metadata["token_source"] == "exact"
    assert body["return_tokens_as_token_ids"] is True and body["stop_token_ids"] == [9]


def test_chat_codec_renders_through_the_chat_renderer_and_decodes_back_to_messages():
    codec = ChatTextCodec()
    renderer = ChatRenderer(codec)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo \ue000 there"}]
    prompt = renderer.prompt_ids(messages)
    assert codec.messages(prompt) == [messages[0], {"role": "user", "content": "héllo \ufffd there"}]
    reply = codec.encode("olleh") + [codec.eos_token_id]
    observation = [{"role": "user", "content": "again"}]
    context = prompt + reply + renderer.observation_ids(observation, ended_with_end_of_turn=True)
    assert codec.messages(context)[-2:] == [{"role": "assistant", "content": "olleh"}, observation[0]]
    assert codec.decode(reply, skip_special_tokens=True) == "olleh"
    with pytest.raises(EngineError, match="does not end with a new assistant turn"):
        codec.messages(prompt + codec.encode("partial"))


def test_cli_rollout_whose_every_episode_failed_exits_1_with_a_one_line_reason(tmp_path, skyrl_cli):
    # the server answers the check before the episodes (GET /models), then refuses every chat request;
    # an unreachable one stops before any episode (tests/core/test_hosted_eval_cli.py)
    with OpenAIServer(make_tokenizer("chatml"), models=["m"]) as server:
        server.inject(Fault(), *[error_fault(400, "the model is unavailable")] * 2)
        result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "openai", "--model", "m", "--n-tasks",
                           "2", "--out", str(tmp_path / "r.jsonl"), f"engine.base_url={server.url}",
                           "engine.mode=chat", env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    reason = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(reason) == 1 and "all 2 episodes failed" in reason[0] and "unavailable" in reason[0], result.output
    assert "wrote 2 trajectories" in result.output


async def test_chat_mode_applies_stop_strings_itself_and_keeps_them_for_the_env():
    with OpenAIServer(make_tokenizer("chatml"), models=["m"]) as server:
        server.chat_replies.extend(["<answer>elppa</answer> and more", "no stop string here"])
        async with OpenAIEngine({"base_url": server.url, "model": "m", "mode": "chat"}) as engine:
            codec = engine.tokenizer
            prompt = codec.apply_chat_template([{"role": "user", "content": "apple"}], tokenize=True,
                                               add_generation_prompt=True)
            params = SamplingParams(max_tokens=100, stop=["</answer>"], stop_token_ids=[codec.eos_token_id])
            stopped = await engine.generate(prompt, params)
            unstopped = await engine.generate(prompt, params.model_copy(update={"max_tokens": 5}))
        bodies = [r.body for r in server.requests_to("/v1/chat/completions")]
    assert stopped.text == "<answer>elppa</answer>" and stopped.stop_reason == "stop"
    assert stopped.token_ids[-1] == codec.eos_token_id and stopped.metadata["token_source"] == "text"
    assert unstopped.text == "no st" and unstopped.stop_reason == "length"
    assert bodies[0]["messages"] == [{"role": "user", "content": "apple"}]
    assert not {"stop", "stop_token_ids", "include_stop_str_in_output"} & set(bodies[0])


def test_chat_mode_refuses_a_tokenizer_with_a_clear_message():
    with pytest.raises(EngineError, match=r"engine.mode=chat needs no tokenizer.*engine.mode=completions"):
        OpenAIEngine({"mode": "chat", "tokenizer": "some/tokenizer"})
