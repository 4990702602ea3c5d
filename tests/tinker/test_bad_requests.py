"""Bad requests get a 4xx with a message and never break the server; sessions are reaped; the CLI.

These are hand-built HTTP requests on purpose: the real client validates most of this before sending.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import zstandard


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(http, server):
    session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    created = http.post("/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": "tiny-random",
                                               "lora_config": {"rank": 2}}).json()
    _wait(http, created["request_id"])
    return created["model_id"]


def _wait(http: httpx.Client, request_id: str) -> dict:
    while True:
        body = http.post("/retrieve_future", json={"request_id": request_id}).json()
        if body.get("type") != "try_again":
            return body


def _fb(model_id: str, tokens: list[int], inputs: dict, loss_fn: str = "cross_entropy") -> dict:
    return {"model_id": model_id, "seq_id": 1, "forward_backward_input": {
        "loss_fn": loss_fn, "data": [{"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
                                      "loss_fn_inputs": inputs}]}}


def _tensor(values: list, dtype: str = "int64") -> dict:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


@pytest.mark.parametrize("case,status,needle", [
    ("unknown_model", 404, "unknown model id"),
    ("wrong_shape", 400, "has shape [2], expected [3]"),
    ("token_outside_vocab", 400, "outside the vocabulary"),
    ("target_outside_vocab", 400, "target_tokens outside the vocabulary"),
    ("missing_input", 400, "missing ['advantages']"),
    ("unknown_loss", 400, "not supported"),
    ("bad_config", 400, "not used by 'cross_entropy'"),
    ("oversize_batch", 400, "at most 1024"),
    ("not_json", 400, "nor JSON"),
    ("missing_field", 400, "missing field"),
])
def test_bad_forward_backward_is_a_4xx(http, model_id, case, status, needle):
    ok_inputs = {"target_tokens": _tensor([2, 3, 4])}
    body = {
        "unknown_model": _fb("nope:train:0", [1, 2, 3], ok_inputs),
        "wrong_shape": _fb(model_id, [1, 2, 3], {"target_tokens": _tensor([2, 3])}),
        "token_outside_vocab": _fb(model_id, [1, 2, 99999], ok_inputs),
        "target_outside_vocab": _fb(model_id, [1, 2, 3], {"target_tokens": _tensor([2, 3, 10**6])}),
        "missing_input": _fb(model_id, [1, 2, 3], {"target_tokens": _tensor([2, 3, 4]),
                                                   "logprobs": _tensor([0.0] * 3, "float32")}, "ppo"),
        "unknown_loss": _fb(model_id, [1, 2, 3], ok_inputs, "kl_magic"),
        "bad_config": {**_fb(model_id, [1, 2, 3], ok_inputs)},
        "oversize_batch": _fb(model_id, [1, 2, 3], ok_inputs),
        "missing_field": {"model_id": model_id},
    }.get(case)
    if case == "bad_config":
        body["forward_backward_input"]["loss_fn_config"] = {"beta": 1.0}
    if case == "oversize_batch":
        body["forward_backward_input"]["data"] *= 1025
    if case == "not_json":
        response = http.post("/forward_backward", content=b"{nope", headers={"content-type": "application/json"})
    else:
        response = http.post("/forward_backward", json=body)
    assert response.status_code == status, response.text
    assert needle in response.json()["detail"]


def test_json_bodies_are_accepted_too(http, model_id):
    """Older clients post JSON to forward_backward and forward; results are protobuf either way."""
    from tinker.proto.response_conv import deserialize_forward_backward_output

    body = _fb(model_id, [1, 2, 3], {"target_tokens": _tensor([2, 3, 4]), "weights": _tensor([0.0, 1.0, 1.0], "float32")})
    for path in ("/forward_backward", "/forward"):
        queued = http.post(path, json=body)
        assert queued.status_code == 200, queued.text
        result = http.post("/retrieve_future", json={"request_id": queued.json()["request_id"]})
        assert result.headers["content-type"] == "application/x-protobuf"
        out = deserialize_forward_backward_output(result.content)
        assert out.loss_fn_outputs[0]["elementwise_loss"].data[0] == 0.0 and out.metrics["loss:sum"] > 0


def test_bad_binary_bodies_and_unsupported_endpoints(http, model_id, monkeypatch):
    garbage = http.post("/forward_backward", content=b"\x00\xffnot-protobuf",
                        headers={"content-type": "application/x-protobuf"})
    assert garbage.status_code == 400 and "protobuf" in garbage.json()["detail"]
    bad_zstd = http.post("/forward_backward", content=b"definitely not zstd",
                         headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert bad_zstd.status_code == 400 and "zstd" in bad_zstd.json()["detail"]
    monkeypatch.setattr("skyrl_tinker.wire.MAX_DECOMPRESSED_BYTES", 1024 * 1024)
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (4 * 1024 * 1024))
    too_big = http.post("/forward_backward", content=bomb,
                        headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert too_big.status_code == 400 and "larger than" in too_big.json()["detail"]
    for path, feature in [("/copy_weights", "copying weights"), ("/create_custom_loss", "custom losses"),
                          ("/no_such_thing", "/api/v1/no_such_thing")]:
        response = http.post(path, json={})
        assert response.status_code == 404 and feature in response.json()["detail"]
    assert http.post("/optim_step", json={"model_id": "nope", "adam_params": {}}).status_code == 404
    assert http.post("/load_weights", json={"model_id": model_id, "path": "s3://x", "optimizer": False}).status_code == 400
    assert http.post("/load_weights", json={"model_id": model_id, "path": "tinker://nope/weights/x",
                                            "optimizer": False}).status_code == 404
    assert http.post("/retrieve_future", json={"request_id": "nope"}).status_code == 404
    assert http.post("/cancel_future", json={"request_id": "nope"}).status_code == 404
    assert http.post("/create_model", json={"session_id": "nope", "model_seq_id": 0, "base_model": "tiny-random",
                                            "lora_config": {"rank": 2}}).status_code == 404
    assert http.get("/healthz").json() == {"status": "ok"}


def test_bad_sample_requests(http, model_id):
    session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    sampling = http.post("/create_sampling_session", json={"session_id": session, "sampling_session_seq_id": 0,
                                                           "base_model": "tiny-random"}).json()["sampling_session_id"]

    def sample(**overrides):
        body = {"sampling_session_id": sampling, "seq_id": 0, "num_samples": 1,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                "sampling_params": {"max_tokens": 2}, **overrides}
        return http.post("/asample", json=body)

    assert sample(prompt={"chunks": [{"type": "encoded_text", "tokens": [1, 10**6]}]}).status_code == 400
    assert sample(num_samples=0).status_code == 400
    assert sample(sampling_params={"max_tokens": 2, "top_p": 0.0}).status_code == 400
    assert "top-k sample logprobs" in sample(topk_sample_logprobs=3).json()["detail"]
    assert sample(topk_prompt_logprobs=1000).status_code == 400
    assert sample(sampling_session_id="nope").status_code == 404
    ok = sample()
    assert ok.status_code == 200 and len(ok.json()["sample_sequence_ids"]) == 1
    # without a sampling session: the base model by name, or a checkpoint path
    no_session = sample(sampling_session_id=None, base_model="tiny-random")
    assert no_session.status_code == 200
    result = http.post("/retrieve_future", json={"request_id": no_session.json()["request_id"]})
    assert result.headers["content-type"] == "application/x-protobuf"
    assert sample(sampling_session_id=None, model_path="tinker://nope/sampler_weights/x").status_code == 404
    assert http.post("/create_sampling_session", json={"session_id": session, "sampling_session_seq_id": 1,
                                                       "base_model": "other/model"}).status_code == 400


def test_a_silent_session_is_reaped(http, server):
    service = server.service
    session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    created = http.post("/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": "tiny-random",
                                               "lora_config": {"rank": 2}}).json()
    _wait(http, created["request_id"])
    assert http.post("/session_heartbeat", json={"session_id": session}).status_code == 200
    service.sessions.get(session).last_seen -= service.sessions.timeout + 1  # as if heartbeats stopped
    assert service.reap() == 1
    assert http.post("/get_info", json={"model_id": created["model_id"]}).status_code == 404
    assert http.post("/session_heartbeat", json={"session_id": session}).status_code == 410
    assert not service.worker.call(lambda backend: backend.has(created["model_id"]))


def test_a_reaped_sessions_sampling_stops(http, server):
    engine = server.service.sampler.engine
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
        sampling = http.post("/create_sampling_session", json={"session_id": session, "sampling_session_seq_id": 0,
                                                               "base_model": "tiny-random"}).json()["sampling_session_id"]
        http.post("/asample", json={"sampling_session_id": sampling, "seq_id": 0, "num_samples": 1,
                                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                                    "sampling_params": {"max_tokens": 1900, "temperature": 0.0, "stop": []}}).raise_for_status()
        deadline = time.monotonic() + 60
        while len(forwards) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.service.sessions.get(session).last_seen -= server.service.sessions.timeout + 1
        assert server.service.reap() == 1
        asyncio.run(engine.release_memory())  # runs once the engine's rows are all done
        assert len(forwards) < 1400, f"{len(forwards)} forwards of 1900: the reaped session's sample went on decoding"
    finally:
        hook.remove()


def test_old_results_are_pruned(http, model_id, server):
    future = server.service.futures.create("test")
    server.service.futures.finish(future, {"ok": True})
    refused = http.post("/cancel_future", json={"request_id": future.request_id})
    assert refused.status_code == 400 and "only sampling requests can be cancelled" in refused.json()["detail"]
    assert http.post("/retrieve_future", json={"request_id": future.request_id}).json() == {"ok": True}
    future.created -= 7200
    server.service.reap()
    assert http.post("/retrieve_future", json={"request_id": future.request_id}).status_code == 404


def test_skyrl_cli_has_the_tinker_command():
    from skyrl_core.cli import build_app
    from typer.testing import CliRunner

    result = CliRunner().invoke(build_app(), ["tinker", "serve", "--help"])
    assert result.exit_code == 0 and "--base-model" in result.output and "--checkpoint-dir" in result.output
