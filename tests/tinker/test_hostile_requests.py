"""What a stranger's script or a web page can send the server, and what it gets: never a 500, never a state
change from a page, never its own input back, never gigabytes spent on a few kilobytes.

Raw HTTP on purpose (the tinker client would not send most of this), on a real server on loopback.
"""

from __future__ import annotations

import json
import threading
import tracemalloc

import httpx
import numpy as np
import pytest
import zstandard
from skyrl_tinker import wire
from tinker_helpers import fb_body, tensor, wait_for

DEEP = b"[" * 100_000 + b"]" * 100_000  # a 200 kB body: Python's json recursion fails at about 1,000 levels
# Every route that reads a JSON body, with a body it would take.
JSON_ROUTES = ["/create_session", "/session_heartbeat", "/create_model", "/get_info", "/unload_model", "/optim_step",
               "/save_weights", "/save_weights_for_sampler", "/load_weights", "/weights_info",
               "/create_sampling_session", "/asample", "/retrieve_future", "/retrieve_futures", "/cancel_future",
               "/forward_backward", "/forward"]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(http):
    session = http.post("/create_session", json={"tags": [], "sdk_version": "test"}).json()["session_id"]
    created = http.post("/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": "tiny-random",
                                               "lora_config": {"rank": 2}}).json()
    wait_for(http, created["request_id"])
    return created["model_id"]


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


# --- item 2: a JSON body under another label or encoding --------------------------------------------------------------


@pytest.mark.parametrize("path", JSON_ROUTES)
@pytest.mark.parametrize("how", ["protobuf-label", "zstd", "gzip", "br"])
def test_deep_json_under_any_label_or_encoding_is_a_4xx_on_every_json_route(http, path, how):
    headers, body = {"content-type": "application/json"}, DEEP
    if how == "protobuf-label":
        headers["content-type"] = "application/x-protobuf"
    elif how == "zstd":
        headers["content-encoding"], body = "zstd", _zstd(DEEP)
    else:
        headers["content-encoding"] = how  # a label only: the bytes are the plain JSON
    response = http.post(path, content=body, headers=headers)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    detail = response.json()["detail"]
    if how in ("gzip", "br"):
        assert response.status_code == 415 and "accepts: identity, zstd" in detail
    elif how == "zstd":
        assert response.status_code == 400 and "deeper than 32" in detail
    elif path in ("/forward_backward", "/forward"):
        assert response.status_code == 400 and "protobuf" in detail
    else:
        assert response.status_code == 415 and "takes a JSON body" in detail


@pytest.mark.parametrize("how", ["protobuf-label", "zstd"])
def test_a_lone_surrogate_is_refused_however_the_body_is_labelled(http, how):
    body = json.dumps({"tags": ["\ud800"], "sdk_version": "x"}).encode()
    headers = {"content-type": "application/x-protobuf"} if how == "protobuf-label" else {
        "content-type": "application/json", "content-encoding": "zstd"}
    response = http.post("/create_session", content=_zstd(body) if how == "zstd" else body, headers=headers)
    assert response.status_code in (400, 415) and response.status_code != 200, response.text


def test_a_zstd_json_body_may_expand_only_to_what_a_plain_one_could_be(http, server):
    """A JSON route's body is small; the 4x cap is for forward_backward batches."""
    limit = server.config.http_limits().max_body_bytes
    padded = b'{"sdk_version": "' + b" " * limit + b'"}'
    response = http.post("/create_session", content=_zstd(padded),
                         headers={"content-type": "application/json", "content-encoding": "zstd"})
    assert response.status_code == 413 and f"{limit:,} bytes" in response.json()["detail"]
    ok = http.post("/create_session", content=_zstd(b'{"sdk_version": "zstd"}'),
                   headers={"content-type": "application/json", "content-encoding": "zstd"})
    assert ok.status_code == 200 and ok.json()["session_id"]


# --- item 4: what a request costs before it is refused ---------------------------------------------------------------


def _protobuf_batch(tokens_per_datum: int, datums: int = 1) -> bytes:
    message = wire._CLASSES["ForwardBackwardRequest"](model_id="m", loss_fn="cross_entropy")
    for _ in range(datums):
        datum = message.data.add()
        datum.model_input.add().encoded_text.tokens = np.ones(tokens_per_datum, np.int32).tobytes()
    return message.SerializeToString()


def test_a_datum_longer_than_the_context_is_refused_from_its_byte_length(server):
    """16 M token ids (64 MB, under the decompression cap) would be 600 MB of Python ints before the context
    check; the byte length refuses it first, and decoding holds little more than the body itself."""
    body = _protobuf_batch(16 * 1024 * 1024)
    bounds = wire.Bounds(max_datums=1024, max_tokens=server.service.backend.max_context)
    tracemalloc.start()
    try:
        with pytest.raises(wire.WireError, match=r"datum 0: 16777216 tokens, the model's context is 2048"):
            wire.parse_forward_backward(body, bounds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(body) + (16 << 20), f"decoding a {len(body):,}-byte body held {peak:,} bytes"


@pytest.mark.parametrize("case,needle", [
    ("too_many_datums", "batch has 1025 datums, the server accepts at most 1024"),
    ("long_datum", "datum 0: 2049 tokens, the model's context is 2048"),
    ("odd_bytes", "not whole int32 ids"),
    ("dense_input_too_long", "has more than 2048 entries"),
    ("sparse_input_too_big", "holds more than 2048 entries"),
])
def test_a_protobuf_batch_past_a_bound_is_a_400_through_the_server(http, model_id, case, needle):
    message = wire._CLASSES["ForwardBackwardRequest"](model_id=model_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.arange(3, dtype=np.int32).tobytes()
    target = datum.loss_fn_inputs["target_tokens"]
    target.dtype, target.dense = wire.DTYPE_INT64, np.arange(1, 4, dtype=np.int64).tobytes()
    target.shape.append(3)
    if case == "too_many_datums":
        for _ in range(1024):
            message.data.add().CopyFrom(datum)
    elif case == "long_datum":
        datum.model_input[0].encoded_text.tokens = np.ones(2049, np.int32).tobytes()
    elif case == "odd_bytes":
        datum.model_input[0].encoded_text.tokens = b"\x01\x00\x00\x00\x02"
    elif case == "dense_input_too_long":
        target.dense = np.ones(4096, np.int64).tobytes()
        del target.shape[:]
    else:  # a few bytes that would be a 10^6 x 10^6 dense tensor
        target.sparse_csr.values = np.ones(1, np.int64).tobytes()
        target.sparse_csr.crow_indices = np.array([0, 1] + [1] * 999_999, np.int64).tobytes()
        target.sparse_csr.col_indices = np.zeros(1, np.int64).tobytes()
        del target.shape[:]
        target.shape.extend([1_000_000, 1_000_000])
    response = http.post("/forward_backward", content=_zstd(message.SerializeToString()),
                         headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert response.status_code == 400 and needle in response.json()["detail"], response.text[:500]


def test_a_json_batch_past_a_bound_is_refused_before_its_tokens_become_ints(http, model_id):
    body = fb_body(model_id, [1] * 100_000, {"target_tokens": tensor([2, 3, 4])})
    response = http.post("/forward_backward", json=body)
    assert response.status_code == 400 and "100000 tokens, the model's context is 2048" in response.json()["detail"]
    body = fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2] * 100_000)})
    response = http.post("/forward_backward", json=body)
    assert response.status_code == 400 and "has more than 2048 entries" in response.json()["detail"]


def test_a_batch_is_decoded_off_the_event_loop(http, model_id, monkeypatch):
    """While one request's body is being decoded, the server answers everyone else."""
    decoding, release = threading.Event(), threading.Event()
    real = wire.parse_forward_backward

    def slow_parse(body, bounds):
        decoding.set()
        assert release.wait(60)
        return real(body, bounds)

    monkeypatch.setattr("skyrl_tinker.routes.training.parse_forward_backward", slow_parse)
    outcome = {}
    sender = threading.Thread(target=lambda: outcome.update(response=http.post(
        "/forward_backward", content=_protobuf_batch(3), headers={"content-type": "application/x-protobuf"})))
    sender.start()
    try:
        assert decoding.wait(60)
        with httpx.Client(base_url=http.base_url, timeout=30) as other:
            assert other.get("/healthz").json() == {"status": "ok"}  # answered while the decode is held
    finally:
        release.set()
        sender.join(60)
    assert outcome["response"].status_code == 404  # model "m" is nobody's: the body was decoded after all


def test_the_decompression_cap_is_the_largest_valid_batch(server, http):
    """tiny-random (context 2048) at 1024 datums needs about 64 MiB: a body expanding past that is 413 at
    once, though it is under 4 x --max-body-mb (256 MiB)."""
    bounds = wire.Bounds(1024, 2048)
    assert bounds.largest_body() < 4 * server.config.http_limits().max_body_bytes
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(bounds.largest_body() + (1 << 20)))
    response = http.post("/forward_backward", content=bomb,
                         headers={"content-type": "application/x-protobuf", "content-encoding": "zstd"})
    assert response.status_code == 413 and f"{bounds.largest_body():,} bytes" in response.json()["detail"]


# --- item 7: a web page may not change state ----------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {}, {"content-type": "text/plain;charset=UTF-8"}, {"content-type": "application/x-www-form-urlencoded"},
    {"content-type": "multipart/form-data; boundary=x"},
    {"content-type": "application/json", "origin": "https://evil.example"},
    {"content-type": "application/json", "origin": "null"},
    {"content-type": "application/json", "sec-fetch-site": "cross-site"},
], ids=["no-cors-fetch", "text-plain", "empty-form", "multipart", "foreign-origin", "null-origin", "cross-site"])
def test_a_web_page_cannot_open_sessions_and_lock_the_owner_out(server, http, headers):
    """64 empty cross-site POSTs would have filled the single user's session quota (429 for the owner)."""
    before = server.service.sessions.count("default")
    for _ in range(70):
        response = httpx.post(f"{server.url}/api/v1/create_session", headers=headers, timeout=30)
        assert response.status_code in (403, 415), response.text
    assert server.service.sessions.count("default") == before
    assert http.post("/create_session", json={"sdk_version": "owner"}).status_code == 200


# --- item 8: errors never repeat the input ------------------------------------------------------------------------


BIG = "X" * 10_000
LONG_NUMBER = "<long number>"  # written as 5,000 nines: more digits than Python parses


def _echo_cases(model_id: str, session_id: str) -> list[tuple[str, str, dict | None]]:
    run = model_id
    return [
        ("POST", "/session_heartbeat", {"session_id": BIG}),
        ("POST", f"/sessions/{BIG}/finish", {}),
        ("POST", "/create_model", {"session_id": BIG, "lora_config": {"rank": 2}}),
        ("POST", "/create_model", {"session_id": session_id, "base_model": BIG, "lora_config": {"rank": 2}}),
        ("POST", "/create_model", {"session_id": session_id, "optimizer_config": {"type": BIG},
                                   "lora_config": {"rank": 2}}),
        ("POST", "/get_info", {"model_id": BIG}),
        ("POST", "/unload_model", {"model_id": BIG}),
        ("POST", "/optim_step", {"model_id": model_id, "adam_params": {"type": BIG}}),
        ("POST", "/optim_step", {"model_id": model_id, "adam_params": {"learning_rate": LONG_NUMBER}}),
        ("POST", "/save_weights", {"model_id": model_id, "path": BIG}),
        ("POST", "/load_weights", {"model_id": model_id, "path": BIG, "optimizer": False}),
        ("POST", "/load_weights", {"model_id": model_id, "path": f"tinker://{BIG}/weights/x", "optimizer": False}),
        ("POST", "/weights_info", {"tinker_path": f"tinker://{run}/weights/{BIG}"}),
        ("POST", "/create_sampling_session", {"session_id": session_id, "model_path": BIG}),
        ("POST", "/create_sampling_session", {"session_id": session_id, "base_model": BIG}),
        ("POST", "/asample", {"sampling_session_id": BIG, "prompt": {"chunks": []}}),
        ("POST", "/asample", {"base_model": "tiny-random", "prompt": {"chunks": [{"type": BIG, "tokens": [1]}]}}),
        ("POST", "/asample", {"base_model": "tiny-random", "prompt": {"chunks": [{"tokens": [1, 2]}]},
                              "sampling_params": {"stop": [{BIG: 1}]}}),
        ("POST", "/retrieve_future", {"request_id": BIG}),
        ("POST", "/cancel_future", {"request_id": BIG}),
        ("POST", "/retrieve_futures", {"target": {"type": BIG}}),
        ("POST", "/forward_backward", fb_body(BIG, [1, 2, 3], {"target_tokens": tensor([2, 3, 4])})),
        ("POST", "/forward_backward", fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4])}, BIG)),
        ("POST", "/forward_backward", fb_body(model_id, [1, 2, 3], {BIG: tensor([2, 3, 4])})),
        ("POST", "/forward_backward", fb_body(model_id, [1, 2, 3], {"target_tokens": {"data": [1], "dtype": BIG}})),
        ("POST", "/forward_backward", fb_body(model_id, [1, 2, 3], {"target_tokens": {
            "data": [1], "dtype": "int64", "shape": [BIG]}})),
        ("POST", "/forward_backward", {**fb_body(model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4])}),
                                       "forward_backward_input": {"loss_fn": "dro", "loss_fn_config": {BIG: 1.0},
                                                                  "data": []}}),
        ("GET", f"/training_runs/{BIG}", None),
        ("GET", f"/training_runs/{BIG}/checkpoints", None),
        ("GET", f"/training_runs?limit={BIG}", None),
        ("DELETE", f"/training_runs/{run}/checkpoints/weights/{BIG}", None),
        ("POST", f"/training_runs/{run}/checkpoints/weights/{BIG}/publish", {}),
        ("GET", f"/samplers/{BIG}", None),
        ("GET", f"/{BIG}", None),
    ]


def test_no_error_repeats_a_10_kb_id_path_name_or_type(http, model_id):
    session = http.post("/create_session", json={"sdk_version": "echo"}).json()["session_id"]
    for method, path, body in _echo_cases(model_id, session):
        content = None if body is None else json.dumps(body).replace('"<long number>"', "9" * 5000)
        response = http.request(method, path, content=content, headers={"content-type": "application/json"})
        where = f"{method} {path[:60]} {json.dumps(body)[:120] if body else ''}"
        assert 400 <= response.status_code < 500, (where, response.status_code, response.text[:300])
        assert len(response.content) < 2000 and "X" * 100 not in response.text, (where, response.text[:300])
        assert "9" * 100 not in response.text, where
