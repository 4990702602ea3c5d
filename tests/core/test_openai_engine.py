"""The ``openai`` engine against a real OpenAI-compatible HTTP server on loopback (tests/core/openai_server.py)."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from openai_server import Completion, Fault, OpenAIServer, error_fault, unused_port
from skyrl_core.chat import ChatRenderer
from skyrl_core.engine import EngineError, InferenceEngine, SamplingParams
from skyrl_core.engines.openai import (
    OpenAIEngine,
    OpenAIEngineConfig,
    OpenAIEngineError,
    OpenAIStatusError,
    OpenAITimeoutError,
    WeightSyncUnsupportedError,
)
from skyrl_core.engines.retry import Backoff, parse_retry_after
from skyrl_core.factory import ConfigError, component_config
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.plugins import get_registry
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_core.trajectory import TrajectoryBatch

MODEL = "tiny-chatml"
PROMPT = [3, 17, 42, 99, 7]
SECRET = "sk-test-secret-4242"


@pytest.fixture(scope="module")
def tok() -> Any:
    return make_tokenizer("chatml")


@pytest.fixture
def server(tok: Any) -> Iterator[OpenAIServer]:
    with OpenAIServer(tok, models=[MODEL]) as srv:
        yield srv


@pytest.fixture
async def make_engine(server: OpenAIServer) -> AsyncIterator[Callable[..., OpenAIEngine]]:
    engines: list[OpenAIEngine] = []

    def make(tokenizer: Any = None, **options: Any) -> OpenAIEngine:
        settings = {"base_url": server.url, "model": MODEL, "backoff_base_s": 0.01, "max_retries": 3, **options}
        engines.append(OpenAIEngine(OpenAIEngineConfig(**settings), tokenizer=tokenizer))
        return engines[-1]

    yield make
    for engine in engines:
        await engine.aclose()


def ids_of(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


# --- completions: token in, token out ----------------------------------------------------------------------------

async def test_generate_sends_prompt_ids_and_returns_the_exact_sampled_ids_and_logprobs(server, make_engine, tok):
    sampled = ids_of(tok, "<answer>olleh</answer>") + [tok.convert_tokens_to_ids("<|im_end|>")]
    logprobs = [-(i + 1) / 16 for i in range(len(sampled))]
    server.completions.append(Completion(sampled, "stop", logprobs))
    params = SamplingParams(max_tokens=32, temperature=0.7, top_p=0.9, top_k=5, stop=["</answer>"],
                            stop_token_ids=[sampled[-1]], seed=11)

    out = await make_engine().generate(PROMPT, params)

    assert out.token_ids == sampled
    assert out.logprobs == logprobs
    assert out.stop_reason == "stop"
    assert out.text == "<answer>olleh</answer>"
    assert out.metadata["retokenized"] is False
    body = server.requests_to("/v1/completions")[0].body
    assert body["prompt"] == PROMPT and body["model"] == MODEL
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 1
    assert {k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "seed")} == {
        "max_tokens": 32, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "stop": ["</answer>"],
        "stop_token_ids": [sampled[-1]], "seed": 11}
    assert body["include_stop_str_in_output"] is True


async def test_defaults_leave_out_server_specific_sampling_fields(server, make_engine):
    server.completions.append(Completion([5, 6]))
    await make_engine().generate(PROMPT, SamplingParams())
    body = server.requests_to("/v1/completions")[0].body
    assert not {"top_k", "stop", "stop_token_ids", "seed", "include_stop_str_in_output", "ignore_eos"} & set(body)
    server.completions.append(Completion([5, 6]))
    await make_engine().generate(PROMPT, SamplingParams(ignore_eos=True))
    assert server.requests_to("/v1/completions")[1].body["ignore_eos"] is True  # vLLM's extension


@pytest.mark.parametrize("server_ignores_max_tokens", [False, True])
async def test_never_more_than_max_tokens_ids(tok, server_ignores_max_tokens):
    with OpenAIServer(tok, models=[MODEL], ignore_max_tokens=server_ignores_max_tokens) as server:
        server.completions.append(Completion(list(range(10, 20)), "stop"))
        async with OpenAIEngine(OpenAIEngineConfig(base_url=server.url, model=MODEL)) as engine:
            out = await engine.generate(PROMPT, SamplingParams(max_tokens=4))
    assert out.token_ids == [10, 11, 12, 13]
    assert out.logprobs is not None and len(out.logprobs) == 4
    assert out.stop_reason == "length"


@pytest.mark.parametrize(("finish_reason", "stop_reason"),
                         [("stop", "stop"), ("length", "length"), ("abort", "abort"), (None, "abort"),
                          ("content_filter", "abort")])
async def test_finish_reason_maps_to_stop_reason(server, make_engine, finish_reason, stop_reason):
    server.completions.append(Completion([5, 6, 7], finish_reason))
    out = await make_engine().generate(PROMPT, SamplingParams(max_tokens=8))
    assert out.stop_reason == stop_reason
    assert out.metadata["finish_reason"] == finish_reason


async def test_text_only_server_is_retokenised_with_the_configured_tokenizer(tok):
    sampled = ids_of(tok, "<answer>regit</answer>")
    with OpenAIServer(tok, models=[MODEL], token_ids=False) as server:
        server.completions.append(Completion(sampled))
        async with OpenAIEngine({"base_url": server.url, "model": MODEL}, tokenizer=tok) as engine:
            out = await engine.generate(PROMPT, SamplingParams(max_tokens=32))
    assert out.token_ids == sampled
    assert out.metadata["retokenized"] is True
    assert out.logprobs is None  # logprobs of the server's tokens do not belong to re-tokenised ids


async def test_text_only_server_without_tokenizer_says_to_set_one(tok):
    with OpenAIServer(tok, models=[MODEL], token_ids=False) as server:
        server.completions.append(Completion(ids_of(tok, "hello")))
        async with OpenAIEngine({"base_url": server.url, "model": MODEL}) as engine:
            with pytest.raises(OpenAIEngineError, match="set engine.tokenizer"):
                await engine.generate(PROMPT, SamplingParams())


async def test_model_defaults_to_the_first_one_the_server_lists(server, make_engine):
    server.completions.extend([Completion([5]), Completion([6])])
    engine = make_engine(model=None)
    await engine.generate(PROMPT, SamplingParams())
    await engine.generate(PROMPT, SamplingParams())
    assert [r.body["model"] for r in server.requests_to("/v1/completions")] == [MODEL, MODEL]
    assert len(server.requests_to("/v1/models")) == 1


async def test_unknown_model_names_the_model_and_hints_at_config(server, make_engine):
    with pytest.raises(OpenAIStatusError) as err:
        await make_engine(model="no-such-model").generate(PROMPT, SamplingParams())
    assert err.value.status == 404
    assert "The model `no-such-model` does not exist." in str(err.value)
    assert "engine.model" in str(err.value)


def test_tokenizer_loads_lazily_from_a_local_path(tok, tmp_path):
    tok.save_pretrained(tmp_path / "tok")
    engine = OpenAIEngine({"tokenizer": str(tmp_path / "tok")})
    assert engine.tokenizer.encode("<answer>olleh</answer>") == tok.encode("<answer>olleh</answer>")
    assert engine.tokenizer is engine.tokenizer
    assert OpenAIEngine().tokenizer is None


def test_unloadable_tokenizer_names_the_config_key(tmp_path):
    missing = str(tmp_path / "missing")
    engine = OpenAIEngine({"tokenizer": missing})
    with pytest.raises(EngineError, match=re.escape(f"cannot load engine.tokenizer {missing!r}")):
        _ = engine.tokenizer


# --- chat ---------------------------------------------------------------------------------------------------------

async def test_chat_returns_the_reply_and_forwards_sampling_fields(server, make_engine):
    server.chat_replies.append("The answer is 4.")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    reply = await make_engine().chat(messages, temperature=0.0, max_tokens=8)
    assert reply == "The answer is 4."
    body = server.requests_to("/v1/chat/completions")[0].body
    assert body == {"model": MODEL, "messages": messages, "temperature": 0.0, "max_tokens": 8}


async def test_chat_errors_carry_status_and_server_message(server, make_engine):
    server.inject(error_fault(422, "messages[1].role must be one of system, user, assistant"))
    with pytest.raises(OpenAIStatusError, match="HTTP 422.*messages\\[1\\].role must be one of"):
        await make_engine().chat([{"role": "robot", "content": "hi"}])


# --- retries, errors, timeouts ------------------------------------------------------------------------------------

async def test_503_twice_then_ok_is_retried_and_succeeds(server, make_engine, caplog):
    server.inject(error_fault(503, "warming up"), error_fault(503, "warming up"))
    server.completions.append(Completion([5, 6]))
    with caplog.at_level(logging.WARNING, logger="skyrl_core.engines.openai"):
        out = await make_engine().generate(PROMPT, SamplingParams())
    assert out.token_ids == [5, 6]
    assert len(server.requests_to("/v1/completions")) == 3
    assert "HTTP 503" in caplog.text and "retry 2/3" in caplog.text


async def test_persistent_5xx_gives_up_naming_status_url_message_and_attempts(server, make_engine):
    server.inject(*[error_fault(502, "upstream engine crashed")] * 5)
    with pytest.raises(OpenAIStatusError) as err:
        await make_engine(max_retries=2).generate(PROMPT, SamplingParams())
    message = str(err.value)
    assert err.value.status == 502
    for part in ("HTTP 502", f"{server.url}/completions", "upstream engine crashed", "after 3 attempts"):
        assert part in message
    assert len(server.requests_to("/v1/completions")) == 3


async def test_429_waits_as_long_as_retry_after_says(server, make_engine):
    server.inject(error_fault(429, "rate limited", {"Retry-After": "1"}))
    server.completions.append(Completion([5]))
    out = await make_engine(backoff_base_s=0.01).generate(PROMPT, SamplingParams())
    first, second = server.requests_to("/v1/completions")
    assert out.token_ids == [5]
    assert second.at - first.at >= 0.9  # the jittered backoff alone would wait about 0.01 s


async def test_400_is_not_retried_and_the_error_names_status_url_and_message(server, make_engine):
    server.inject(error_fault(400, "This model's maximum context length is 2048 tokens."))
    with pytest.raises(OpenAIStatusError) as err:
        await make_engine().generate(PROMPT, SamplingParams())
    assert str(err.value).startswith(f"HTTP 400 Bad Request from POST {server.url}/completions: "
                                     "This model's maximum context length is 2048 tokens.")
    assert len(server.requests_to("/v1/completions")) == 1


async def test_huge_error_body_is_truncated(server, make_engine):
    server.inject(error_fault(400, "x" * 20_000))
    with pytest.raises(OpenAIStatusError) as err:
        await make_engine().generate(PROMPT, SamplingParams())
    assert len(str(err.value)) < 1000
    assert "more chars" in str(err.value)


async def test_plain_text_error_body_is_quoted(server, make_engine):
    server.inject(Fault(500, b"Internal Server Error: CUDA out of memory", {"Content-Type": "text/plain"}))
    with pytest.raises(OpenAIStatusError) as err:
        await make_engine(max_retries=0).generate(PROMPT, SamplingParams())
    assert str(err.value) == (f"HTTP 500 Internal Server Error from POST {server.url}/completions: "
                              "Internal Server Error: CUDA out of memory")


async def test_slow_server_raises_a_named_timeout_after_retrying(server, make_engine):
    server.inject(Fault(delay_s=1.5), Fault(delay_s=1.5))
    with pytest.raises(OpenAITimeoutError) as err:
        await make_engine(timeout_s=0.3, max_retries=1).generate(PROMPT, SamplingParams())
    assert "timed out after 0.3 s (engine.timeout_s)" in str(err.value)
    assert "after 2 attempts" in str(err.value)


async def test_one_slow_answer_is_retried_and_succeeds(server, make_engine):
    server.inject(Fault(delay_s=1.0))
    server.completions.extend([Completion([8]), Completion([9])])
    out = await make_engine(timeout_s=0.3).generate(PROMPT, SamplingParams())
    assert out.token_ids == [8]  # the retry is answered while the abandoned request still sleeps
    assert len(server.requests_to("/v1/completions")) == 2


async def test_malformed_json_body_is_a_clear_error(server, make_engine):
    server.inject(Fault(200, b'{"choices": [{"text": "unterminated'))
    with pytest.raises(OpenAIEngineError, match='not valid JSON: \'{"choices": \\[{"text": "unterminated\''):
        await make_engine().generate(PROMPT, SamplingParams())


async def test_json_without_choices_is_a_clear_error(server, make_engine):
    server.inject(Fault(200, b'{"object": "error", "detail": "overloaded"}'))
    with pytest.raises(OpenAIEngineError, match="returned no choices \\(response keys: \\['detail', 'object'\\]\\)"):
        await make_engine().generate(PROMPT, SamplingParams())


async def test_connection_refused_names_the_url_after_retrying():
    url = f"http://127.0.0.1:{unused_port()}/v1"
    async with OpenAIEngine({"base_url": url, "model": MODEL, "max_retries": 1, "backoff_base_s": 0.01}) as engine:
        with pytest.raises(OpenAIEngineError) as err:
            await engine.generate(PROMPT, SamplingParams())
    assert f"cannot reach POST {url}/completions" in str(err.value)
    assert "after 2 attempts" in str(err.value)
    assert isinstance(err.value, EngineError)


def test_backoff_doubles_with_jitter_and_is_capped():
    backoff = Backoff(base_s=1.0, max_s=8.0)
    for attempt, (low, high) in enumerate([(0.5, 1), (1, 2), (2, 4), (4, 8), (4, 8), (4, 8)]):
        delays = [backoff.delay(attempt) for _ in range(50)]
        assert all(low <= d <= high for d in delays) and len(set(delays)) > 1
    assert backoff.delay(0, retry_after=3.0) == 3.0
    assert backoff.delay(0, retry_after=600.0) == 8.0


def test_retry_after_accepts_seconds_and_http_dates():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now) == 30.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


# --- API key ------------------------------------------------------------------------------------------------------

async def test_api_key_from_env_is_sent_as_bearer_with_extra_headers(server, make_engine, monkeypatch):
    monkeypatch.setenv("SKYRL_TEST_API_KEY", SECRET)
    server.completions.append(Completion([5]))
    engine = make_engine(api_key_env="SKYRL_TEST_API_KEY", headers={"X-Team": "rl"})
    await engine.generate(PROMPT, SamplingParams())
    headers = server.requests_to("/v1/completions")[0].headers
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert headers["x-team"] == "rl"
    assert SECRET not in repr(engine) and SECRET not in repr(engine.config)


async def test_no_key_sends_no_authorization_header(server, make_engine, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.completions.append(Completion([5]))
    await make_engine().generate(PROMPT, SamplingParams())
    assert "authorization" not in server.requests_to("/v1/completions")[0].headers


async def test_api_key_never_appears_in_errors_or_logs_even_when_the_server_echoes_it(server, make_engine, caplog):
    server.inject(error_fault(503, f"overloaded (key {SECRET})"), error_fault(401, f"Incorrect API key: {SECRET}"))
    with caplog.at_level(logging.WARNING, logger="skyrl_core.engines.openai"):
        with pytest.raises(OpenAIStatusError) as err:
            await make_engine(api_key=SECRET).generate(PROMPT, SamplingParams())
    assert err.value.status == 401
    assert "Incorrect API key: ***" in str(err.value) and "OPENAI_API_KEY" in str(err.value)
    assert "overloaded (key ***)" in caplog.text
    assert SECRET not in str(err.value) and SECRET not in caplog.text
    assert server.requests_to("/v1/completions")[0].headers["authorization"] == f"Bearer {SECRET}"


# --- engine protocol, concurrency, config -------------------------------------------------------------------------

async def test_update_weights_refuses_with_a_clear_reason(make_engine):
    with pytest.raises(WeightSyncUnsupportedError, match="hf or vllm engine") as err:
        await make_engine().update_weights({"w": [0.0]})
    assert isinstance(err.value, NotImplementedError)


async def test_requests_in_flight_never_exceed_max_concurrency(tok):
    with OpenAIServer(tok, models=[MODEL], latency_s=0.1, responder=lambda prompt: Completion([prompt[0]])) as server:
        async with OpenAIEngine({"base_url": server.url, "model": MODEL, "max_concurrency": 2}) as engine:
            outs = await asyncio.gather(*(engine.generate([i], SamplingParams()) for i in range(6)))
    assert [o.token_ids for o in outs] == [[i] for i in range(6)]
    assert server.max_in_flight == 2


def test_one_engine_works_across_separate_event_loops(server, tok):
    server.completions.extend([Completion([5]), Completion([6])])
    engine = OpenAIEngine({"base_url": server.url, "model": MODEL})
    first = asyncio.run(engine.generate(PROMPT, SamplingParams()))
    second = asyncio.run(engine.generate(PROMPT, SamplingParams()))
    assert (first.token_ids, second.token_ids) == ([5], [6])


def test_engine_is_registered_and_satisfies_the_protocol():
    spec = get_registry().get("engine", "openai")
    assert spec.load() is OpenAIEngine and spec.config_class() is OpenAIEngineConfig
    assert isinstance(OpenAIEngine(), InferenceEngine)
    config = component_config("engine", "openai", {"model": "m", "timeout_s": 5})
    assert isinstance(config, OpenAIEngineConfig) and config.timeout_s == 5


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="engine.base_ur: unknown key. Did you mean 'base_url'"):
        component_config("engine", "openai", {"base_ur": "http://x/v1"})
    with pytest.raises(ConfigError, match="engine.base_url: .*must start with http:// or https://"):
        OpenAIEngine({"base_url": "127.0.0.1:8000/v1"})
    with pytest.raises(ConfigError, match="engine.max_retries"):
        OpenAIEngine({"max_retries": -1})


def test_importing_the_engine_module_does_not_import_httpx():
    code = ("import sys, skyrl_core, skyrl_core.engines.openai as m; m.OpenAIEngineConfig(); m.OpenAIEngine(); "
            "print('httpx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- end to end: a real rollout through the default generator ------------------------------------------------------

def reverse_text_responder(tok: Any, wrong_first: bool = False) -> Callable[[list[int]], Completion]:
    """Answers reverse_text prompts: the reversed user text (after one wrong try when ``wrong_first``)."""
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def respond(prompt: list[int]) -> Completion:
        text = tok.decode(prompt, skip_special_tokens=False)
        first_user = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        answer = first_user[::-1] if not wrong_first or "Not quite" in text else "xyz"
        return Completion(ids_of(tok, f"<answer>{answer}</answer>") + [end])

    return respond


async def test_rollout_through_the_generator_is_token_exact(tok):
    tasks = [{"id": "a", "text": "apple"}, {"id": "b", "text": "river stone"}, {"id": "c", "text": "piano"}]
    with OpenAIServer(tok, models=[MODEL], responder=reverse_text_responder(tok)) as server:
        async with OpenAIEngine({"base_url": server.url, "model": MODEL}) as engine:
            gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=2, max_tokens_per_turn=64),
                                     engine=engine, tokenizer=tok, env_id="reverse_text")
            batch = await gen.generate(tasks)
    trajectories = list(batch)
    assert len(trajectories) == 6
    assert all(t.error is None and t.reward == 1.0 for t in trajectories), [t.error for t in trajectories]
    renderer = ChatRenderer(tok)
    sent_by_prompt = {tuple(r.body["prompt"]): r.sent for r in server.requests_to("/v1/completions")}
    for t in trajectories:
        assert t.prompt_ids == renderer.prompt_ids(t.messages[:2])
        sent = sent_by_prompt[tuple(t.prompt_ids)]
        assert t.response_ids == sent.token_ids and t.logprobs == sent.logprobs
        assert t.loss_mask == [1] * len(sent.token_ids)


async def test_two_turn_rollout_keeps_ids_masks_and_logprobs_exact(tok):
    with OpenAIServer(tok, models=[MODEL], responder=reverse_text_responder(tok, wrong_first=True)) as server:
        async with OpenAIEngine({"base_url": server.url, "model": MODEL}) as engine:
            gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_tokens_per_turn=64),
                                     engine=engine, tokenizer=tok, env_id="reverse_text")
            (traj,) = list(await gen.generate([{"id": "a", "text": "lemon"}]))
    first, second = server.sent
    first_request, second_request = server.requests_to("/v1/completions")
    observation = traj.response_ids[len(first.token_ids): len(traj.response_ids) - len(second.token_ids)]
    assert len(traj.turns) == 2 and traj.turns[-1].reward == 1.0
    assert traj.response_ids == first.token_ids + observation + second.token_ids
    assert second_request.body["prompt"] == first_request.body["prompt"] + first.token_ids + observation
    assert traj.loss_mask == [1] * len(first.token_ids) + [0] * len(observation) + [1] * len(second.token_ids)
    assert traj.logprobs == first.logprobs + [0.0] * len(observation) + second.logprobs
    assert "Not quite" in tok.decode(observation)


async def test_a_failing_request_ends_only_its_own_episode(tok):
    tasks = [{"id": str(i), "text": word} for i, word in enumerate(["apple", "river", "stone", "cloud"])]
    with OpenAIServer(tok, models=[MODEL], responder=reverse_text_responder(tok)) as server:
        server.inject(error_fault(400, "prompt is too long"))
        async with OpenAIEngine({"base_url": server.url, "model": MODEL}) as engine:
            gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_tokens_per_turn=64),
                                     engine=engine, tokenizer=tok, env_id="reverse_text")
            trajectories = list(await gen.generate(tasks))
    failed = [t for t in trajectories if t.error is not None]
    assert len(failed) == 1 and "HTTP 400" in failed[0].error and "prompt is too long" in failed[0].error
    assert sorted(t.reward for t in trajectories) == [0.0, 1.0, 1.0, 1.0]


def test_skyrl_rollout_cli_runs_episodes_on_the_openai_engine(tok, tmp_path, skyrl_cli):
    tok.save_pretrained(tmp_path / "tok")
    out = tmp_path / "rollouts.jsonl"
    with OpenAIServer(tok, models=[MODEL], responder=reverse_text_responder(tok)) as server:
        result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "openai", "--model", MODEL,
                           "--n-tasks", "3", "--samples", "2", "--out", str(out),
                           f"engine.base_url={server.url}", f"engine.tokenizer={tmp_path / 'tok'}")
    assert result.exit_code == 0, result.output
    assert "wrote 6 trajectories" in result.output
    trajectories = list(TrajectoryBatch.from_jsonl(out))
    assert [t.reward for t in trajectories] == [1.0] * 6
    sent_by_prompt = {tuple(r.body["prompt"]): r.sent for r in server.requests_to("/v1/completions")}
    assert all(t.response_ids == sent_by_prompt[tuple(t.prompt_ids)].token_ids for t in trajectories)
