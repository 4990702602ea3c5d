"""Sampling and checkpoints through the real ``tinker`` client: logprobs agree with compute_logprobs,
seeds reproduce, and a checkpoint saved before a server restart samples identically after it."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import tinker
from skyrl_trainers.models import load_tokenizer
from tinker import types
from tinker_helpers import train_a_little

PROMPT = [5, 17, 42, 99, 7]


def test_sampled_logprobs_equal_compute_logprobs(service_client):
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=4, seed=0).result()
    train_a_little(client, 3, 1e-2)
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    result = sampler.sample(types.ModelInput.from_ints(PROMPT), 3, params).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) and seq.stop_reason in ("stop", "length")
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + list(seq.tokens))).result()
        assert scored[0] is None
        np.testing.assert_allclose(scored[len(PROMPT):], seq.logprobs, atol=1e-4)
    # the same seed gives the same tokens; samples of one request differ from each other
    again = sampler.sample(types.ModelInput.from_ints(PROMPT), 3, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]
    assert len({tuple(s.tokens) for s in result.sequences}) > 1
    # temperature, top-k and top-p change the distribution sampled from, not the reported logprobs' meaning
    greedy = sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                            types.SamplingParams(max_tokens=6, temperature=0.0)).result().sequences[0]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROMPT + list(greedy.tokens))).result()
    np.testing.assert_allclose(scored[len(PROMPT):], greedy.logprobs, atol=1e-4)
    top = sampler.sample(types.ModelInput.from_ints(PROMPT), 2,
                         types.SamplingParams(max_tokens=6, top_k=3, top_p=0.9, seed=1)).result()
    assert all(len(s.tokens) >= 1 for s in top.sequences)


def test_top_k_prompt_logprobs(service_client):
    sampler = service_client.create_sampling_client(base_model="tiny-random").result()
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1),
                         include_prompt_logprobs=True, topk_prompt_logprobs=4).result()
    topk, scored = out.topk_prompt_logprobs, out.prompt_logprobs
    assert topk[0] is None and scored[0] is None and len(topk) == len(PROMPT)
    for position in range(1, len(PROMPT)):
        row = topk[position]
        assert len(row) == 4 and [lp for _, lp in row] == sorted((lp for _, lp in row), reverse=True)
        assert row[0][1] >= scored[position] - 1e-6
        for token, lp in row:
            if token == PROMPT[position]:
                assert lp == pytest.approx(scored[position], abs=1e-5)
    last = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=1),
                          include_prompt_logprobs=True, topk_prompt_logprobs=2, prompt_logprobs_last_n=2).result()
    assert last.prompt_logprobs[:3] == [None] * 3 and last.topk_prompt_logprobs[:3] == [None] * 3
    assert all(row is not None for row in last.topk_prompt_logprobs[3:])


def test_stop_token_ends_the_sample(service_client):
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=4, seed=0).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    free = sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                          types.SamplingParams(max_tokens=8, seed=3)).result().sequences[0]
    stop_at = free.tokens[2]
    stopped = sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                             types.SamplingParams(max_tokens=8, seed=3, stop=[stop_at])).result().sequences[0]
    assert stopped.stop_reason == "stop"
    assert list(stopped.tokens) == list(free.tokens[:free.tokens.index(stop_at) + 1])


def test_an_empty_stop_list_decodes_past_eos(service_client):
    sampler = service_client.create_sampling_client(base_model="tiny-random").result()
    eos = load_tokenizer("tiny-random").eos_token_id
    prompt = types.ModelInput.from_ints([5, 17, 42])
    free = sampler.sample(prompt, 16, types.SamplingParams(max_tokens=96, seed=0)).result().sequences
    assert any(s.stop_reason == "stop" and s.tokens[-1] == eos for s in free)  # tiny-random ends some early
    past = sampler.sample(prompt, 16, types.SamplingParams(max_tokens=96, seed=0, stop=[])).result().sequences
    assert all(s.stop_reason == "length" and len(s.tokens) == 96 for s in past)


def test_base_model_sampling_client(service_client):
    sampler = service_client.create_sampling_client(base_model="tiny-random").result()
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=4, seed=0)).result()
    assert len(out.sequences[0].tokens) == 4


def test_checkpoints_survive_a_restart(tmp_path, new_server):
    first = new_server(tmp_path)
    service = first.client()
    client = service.create_lora_training_client(base_model="tiny-random", rank=4, seed=3).result()
    train_a_little(client, 3, 1e-2)
    state_path = client.save_state("step3").result().path
    sampler_path = client.save_weights_for_sampler("step3").result().path
    params = types.SamplingParams(max_tokens=10, seed=11)
    before = client.create_sampling_client(sampler_path).result().sample(
        types.ModelInput.from_ints(PROMPT), 2, params).result()
    probe = [types.Datum(model_input=types.ModelInput.from_ints(PROMPT[:-1]),
                         loss_fn_inputs={"target_tokens": PROMPT[1:]})]
    loss_before = client.forward(probe, "cross_entropy").result().metrics["loss:sum"]
    run_id = client.model_id
    service.close("success").result()
    first.stop()

    second = new_server(tmp_path)
    try:
        service = second.client()
        rest = tinker.RestClient(base_url=second.url, api_key="tml-skyrl-test")
        listed = rest.list_checkpoints(run_id).result().checkpoints
        assert {c.tinker_path for c in listed} == {state_path, sampler_path}
        run = rest.get_training_run(run_id).result()
        assert run.base_model == "tiny-random" and run.lora_rank == 4
        assert run.last_checkpoint.tinker_path == state_path
        assert run_id in [r.training_run_id for r in rest.list_training_runs().result().training_runs]
        assert rest.get_weights_info_by_tinker_path(state_path).result().lora_rank == 4
        after = service.create_sampling_client(model_path=sampler_path).result().sample(
            types.ModelInput.from_ints(PROMPT), 2, params).result()
        assert [s.tokens for s in after.sequences] == [s.tokens for s in before.sequences]
        for a, b in zip(after.sequences, before.sequences, strict=True):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
        resumed = service.create_training_client_from_state_with_optimizer(state_path).result()
        assert resumed.forward(probe, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(loss_before, rel=1e-6)
        train_a_little(resumed, 1, 1e-2)  # the restored optimizer state steps on
        rest.delete_checkpoint(run_id, "sampler_weights/step3").result()
        assert [c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints] == [state_path]
        service.close("success").result()
    finally:
        second.stop()


def test_concurrent_samples_complete_through_the_session_poller(server, service_client):
    """The client runs one ``retrieve_futures`` poller per sampling client (the server's client config
    turns it on): every sample enters the session's completion log, and payloads the client reports
    as read are dropped from the server."""
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=4, seed=1).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    futures = [sampler.sample(types.ModelInput.from_ints(PROMPT + [i]), 1, params) for i in range(8)]
    results = [f.result() for f in futures]
    assert all(len(r.sequences[0].tokens) >= 1 for r in results)
    logs = {target: log for target, log in server.service.futures._logs.items()}
    (log,) = [log for target, log in logs.items() if target[0] == sampler._sampling_session_id]
    assert log.cursor == 8  # all eight completions were logged for the poller, in completion order

    def kept() -> int:
        return sum(f.target is not None and f.target[0] == sampler._sampling_session_id
                   for f in list(server.service.futures._futures.values()))

    deadline = time.monotonic() + 30
    while kept() and time.monotonic() < deadline:  # the poller reports read payloads on its next poll
        time.sleep(0.05)
    assert kept() == 0


def test_an_abandoned_sample_is_cancelled_on_the_server(server, service_client):
    """The server's client config turns the client's cancel_future on: a sample future the caller
    cancels fails on the server and its row stops decoding; sampling goes on."""
    engine = server.service.sampler.engine
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    sampler = service_client.create_sampling_client(base_model="tiny-random").result()
    try:  # stop=[]: decode to max_tokens unless cancelled
        future = sampler.sample(types.ModelInput.from_ints(PROMPT), 1,
                                types.SamplingParams(max_tokens=1900, temperature=0, stop=[]))
        deadline = time.monotonic() + 60
        while len(forwards) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        (on_server,) = [f for f in list(server.service.futures._futures.values()) if f.kind == "sample" and not f.done]
        future.future().cancel()
        while not on_server.done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert on_server.error == "cancelled by the client"
        asyncio.run(engine.release_memory())  # runs once the engine's rows are all done
        # 1900 forwards if it went on (a loaded machine may decode a few hundred steps before the cancel lands)
        assert len(forwards) < 1400, f"{len(forwards)} forwards: the cancelled sample went on decoding"
    finally:
        hook.remove()
    after = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=3, seed=0)).result()
    assert len(after.sequences[0].tokens) <= 3


def test_retrieve_futures_answers_at_once_with_timeout_zero_and_names_an_unknown_session(server):
    import httpx

    with httpx.Client(base_url=server.url, headers={"X-API-Key": "tml-skyrl-test"}) as http:
        unknown = http.post("/api/v1/retrieve_futures", json={
            "target": {"type": "sampling_session", "sampling_session_id": "nope"}, "prev_cursor": 0, "timeout": 0})
        assert unknown.status_code == 404 and "nope" in unknown.text
