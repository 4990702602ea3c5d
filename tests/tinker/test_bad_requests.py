"""Bad requests get a 4xx with a message and never break the server; sessions are reaped; the CLI.

These are hand-built HTTP requests on purpose: the real client validates most of this before sending.
"""

from __future__ import annotations

import asyncio
import socket
import time
import tracemalloc

import httpx
import pytest
import zstandard
from skyrl_tinker.tenants import DEFAULT_TENANT
from skyrl_tinker.wire import DECOMPRESS_CHUNK, BodyTooLargeError, decompress
from tinker_helpers import fb_body, tensor, wait_for


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(http, server):
    session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    created = http.post("/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": "tiny-random",
                                               "lora_config": {"rank": 2}}).json()
    wait_for(http, created["request_id"])
    return created["model_id"]


@pytest.mark.parametrize("case,status,needle", [
    ("unknown_model", 404, "unknown model id"),
    ("wrong_shape", 400, "has shape [2], expected [3]"),
    ("token_outside_vocab", 400, "outside the vocabulary"),
    ("target_outside_vocab", 400, "target_tokens outside the vocabulary"),
    ("missing_input", 400, "missing ['advantages']"),
    ("unknown_loss", 400, "not supported"),
    ("bad_config", 400, "not used by 'cross_entropy'"),
    ("oversize_batch", 400, "at most 1024"),
    ("not_json", 400, "the body is not JSON"),
    ("missing_field", 400, "forward_backward_input is required"),
    ("sparse_bomb", 400, "holds more than 2048 entries (one per token at most)"),
])
def test_bad_forward_backward_is_a_4xx(http, model_id, case, status, needle):
    ok_inputs = {"target_tokens": tensor([2, 3, 4])}
    body = {
        "unknown_model": fb_body("nope:train:0", [1, 2, 3], ok_inputs),
        "wrong_shape": fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3])}),
        "token_outside_vocab": fb_body(model_id, [1, 2, 99999], ok_inputs),
        "target_outside_vocab": fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 10**6])}),
        "missing_input": fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4]),
                                                   "logprobs": tensor([0.0] * 3, "float32")}, "ppo"),
        "unknown_loss": fb_body(model_id, [1, 2, 3], ok_inputs, "kl_magic"),
        "bad_config": {**fb_body(model_id, [1, 2, 3], ok_inputs)},
        "oversize_batch": fb_body(model_id, [1, 2, 3], ok_inputs),
        "missing_field": {"model_id": model_id},
        "sparse_bomb": fb_body(model_id, [1, 2, 3], {"target_tokens": {  # a few bytes that would be 4 PB dense
            "data": [1], "dtype": "int64", "shape": [10**6, 10**9], "sparse_crow_indices": [0, 1],
            "sparse_col_indices": [0]}}),
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

    body = fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4]), "weights": tensor([0.0, 1.0, 1.0], "float32")})
    for path in ("/forward_backward", "/forward"):
        queued = http.post(path, json=body)
        assert queued.status_code == 200, queued.text
        result = http.post("/retrieve_future", json={"request_id": queued.json()["request_id"]})
        assert result.headers["content-type"] == "application/x-protobuf"
        out = deserialize_forward_backward_output(result.content)
        assert out.loss_fn_outputs[0]["elementwise_loss"].data[0] == 0.0 and out.metrics["loss:sum"] > 0


def test_bad_binary_bodies_and_unsupported_endpoints(http, model_id):
    garbage = http.post("/forward_backward", content=b"\x00\xffnot-protobuf",
                        headers={"content-type": "application/x-protobuf"})
    assert garbage.status_code == 400 and "protobuf" in garbage.json()["detail"]
    bad_zstd = http.post("/forward_backward", content=b"definitely not zstd",
                         headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert bad_zstd.status_code == 400 and "zstd" in bad_zstd.json()["detail"]
    bomb = _zstd_zeros(768 * 1024 * 1024)  # the default --max-body-mb 64 lets a body expand to 256 MB
    too_big = http.post("/forward_backward", content=bomb,
                        headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert too_big.status_code == 413 and "the most a valid request" in too_big.json()["detail"], too_big.text
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


def _zstd_zeros(size: int) -> bytes:
    """A zstd frame of ``size`` zero bytes (about 24 KB for 768 MB), compressed a chunk at a time."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    chunk = bytes(4 * 1024 * 1024)
    return b"".join([compressor.compress(chunk) for _ in range(size // len(chunk))] + [compressor.flush()])


def test_a_zstd_bomb_is_refused_while_it_decompresses():
    """Decompression counts its output as it goes: a 768 MB bomb is refused once the cap is passed, with
    at most the cap plus one chunk read."""
    bomb = _zstd_zeros(768 * 1024 * 1024)
    assert len(bomb) < 32 * 1024
    cap = 8 * 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLargeError, match=f"more than {cap:,} bytes"):
            decompress(bomb, "zstd", cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < cap + 2 * DECOMPRESS_CHUNK, peak
    small = zstandard.ZstdCompressor().compress(b"abc" * 1000)
    assert decompress(small, "zstd", cap) == b"abc" * 1000


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
    wait_for(http, created["request_id"])
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
    future = server.service.futures.create("test", DEFAULT_TENANT)
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


# --- core's HTTP hygiene, as this server applies it ---------------------------------------------------------------


@pytest.mark.parametrize(("headers", "body", "status"), [
    ({"host": "rebound.attacker.example:8000"}, b'{"tags": [], "sdk_version": "x"}', 421),
    ({"content-type": "text/plain"}, b'{"tags": [], "sdk_version": "x"}', 415),
    ({"content-type": "application/x-www-form-urlencoded"}, b"tags=1", 415),
    ({}, b'{"tags": ' + b"[" * 40 + b"]" * 40 + b', "sdk_version": "x"}', 400),
    ({}, b'{"tags": ["\\ud800"], "sdk_version": "x"}', 400),
], ids=["foreign-host", "text-plain", "form", "nested", "lone-surrogate"])
def test_what_a_web_page_or_another_client_sends_is_refused_before_a_route_reads_it(http, headers, body, status):
    response = http.post("/create_session", content=body, headers={"content-type": "application/json", **headers})
    assert response.status_code == status, response.text
    assert set(response.json()) == {"detail"} and len(response.content) < 1000
    assert http.post("/create_session", json={"tags": [], "sdk_version": "test"}).status_code == 200


def test_a_declared_body_above_the_limit_is_413_before_it_is_sent(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: tml-skyrl-test\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (65 * 1024 * 1024))
        reply = read_response(sock)
    assert reply.startswith(b"HTTP/1.1 413") and b"67,108,864 bytes" in reply


def read_response(sock: socket.socket) -> bytes:
    """The whole HTTP response: its head, then as many body bytes as its Content-Length says (the body
    may come in a later TCP segment than the head: seen once under load)."""
    reply = b""
    while True:
        head, sep, body = reply.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                return reply
        chunk = sock.recv(65536)
        if not chunk:
            return reply
        reply += chunk


def test_json_inside_a_zstd_body_is_checked_once_decompressed(http, model_id):
    nested = b'{"model_id": "%s", "forward_backward_input": %s}' % (model_id.encode(), b"[" * 100 + b"]" * 100)
    response = http.post("/forward_backward", content=zstandard.ZstdCompressor().compress(nested),
                         headers={"content-type": "application/json", "content-encoding": "zstd"})
    assert response.status_code == 400 and "deeper than 32" in response.json()["detail"]
