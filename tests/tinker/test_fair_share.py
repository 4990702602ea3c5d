"""Fair share between tenants: one tenant's flood of queued requests delays another tenant's small
request by about one round, not the whole flood, on the training worker and on the sampler.

The floods are queued while the worker (or the sampler) is held, so every run starts from the same
queue; the server records the order its futures settle in, which the assertions read (no timing).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from tinker_helpers import ALICE, BOB, JSON_PROMPT, KEYS, tenant_http, tensor, wait_for, worker_held

FLOOD = 40
DATUMS = 4  # per request of Alice's flood, of 3 tokens each


@pytest.fixture(scope="module")
def pair(new_server, tmp_path_factory, one_thread):
    """A two-tenant server; Alice and Bob each have a model. A tenant's share of a training round is four
    of Alice's requests (the default, one micro-batch of 8192 tokens, would take a heavy flood)."""
    server = new_server(tmp_path_factory.mktemp("fair"), api_keys=KEYS)
    server.service.worker.round_tokens = 4 * DATUMS * 3
    alice, bob = server.client(ALICE), server.client(BOB)
    models = {who: client.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
              for who, client in (("alice", alice), ("bob", bob))}
    yield server, alice, bob, models
    alice.close("success").result()
    bob.close("success").result()
    server.stop()


@pytest.fixture
def settled(pair, monkeypatch) -> list[str]:
    """Request ids in the order the server settles them."""
    futures = pair[0].service.futures
    order: list[str] = []
    for name in ("finish", "fail"):
        settle = getattr(futures, name)

        def record(future, *args, settle=settle, **kwargs):
            order.append(future.request_id)
            return settle(future, *args, **kwargs)

        monkeypatch.setattr(futures, name, record)
    return order


@contextlib.contextmanager
def sampler_held(server) -> Iterator[None]:
    """Keep the sampler's event loop busy, so requests sent meanwhile are all waiting when it looks."""
    gate = threading.Event()
    server.service.sampler._loop.call_soon_threadsafe(gate.wait)
    try:
        yield
    finally:
        gate.set()


def fb_request(model_id: str, datums: int) -> dict:
    """A JSON ``forward_backward`` body of ``datums`` three-token cross-entropy datums."""
    datum = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
             "loss_fn_inputs": {"target_tokens": tensor([2, 3, 4])}}
    return {"model_id": model_id, "seq_id": 1,
            "forward_backward_input": {"loss_fn": "cross_entropy", "data": [datum] * datums}}


def sample_request(sampling_id: str, num_samples: int) -> dict:
    return {"sampling_session_id": sampling_id, "seq_id": 0, "num_samples": num_samples, "prompt": JSON_PROMPT,
            "sampling_params": {"max_tokens": 3, "seed": 0}}


def flood_then_one(server, route: str, alices: list[dict], bobs: dict) -> tuple[list[str], str]:
    """Alice's requests, then Bob's one, each queued at once; their request ids, once all are done."""
    with tenant_http(server, ALICE) as http, tenant_http(server, BOB) as bob_http:
        queued = [http.post(route, json=body).json()["request_id"] for body in alices]
        bob = bob_http.post(route, json=bobs).json()["request_id"]
    return queued, bob


def wait_all(server, queued: list[str], bob: str) -> None:
    with tenant_http(server, ALICE) as http, tenant_http(server, BOB) as bob_http:
        assert all(wait_for(http, request_id).status_code == 200 for request_id in queued)
        assert wait_for(bob_http, bob).status_code == 200


def test_a_small_forward_backward_overtakes_another_tenants_flood(pair, settled):
    """Alice queues 40 forward_backward requests of a quarter of her share each, then Bob one of one
    datum: Bob's runs in the first round, with Alice's first four; Alice's keep her order."""
    server, _, _, models = pair
    with worker_held(server):
        queued, bob = flood_then_one(server, "/forward_backward", [fb_request(models["alice"].model_id, DATUMS)] * FLOOD,
                                     fb_request(models["bob"].model_id, 1))
    wait_all(server, queued, bob)
    after_bob = settled[settled.index(bob) + 1:]
    assert sum(request_id in after_bob for request_id in queued) >= FLOOD - 4
    assert [r for r in settled if r in queued] == queued  # one model's requests run in the order sent


def test_a_small_sample_overtakes_another_tenants_flood(pair, settled):
    """Alice queues 16 sample requests of a quarter of what the sampler runs at once, on her sampler;
    then Bob one sample of the base model: it runs after Alice's first turn (4 requests), not after
    all 16."""
    server, alice, bob, models = pair
    mine = models["alice"].save_weights_and_get_sampling_client().result()._sampling_session_id
    theirs = bob.create_sampling_client(base_model="tiny-random").result()._sampling_session_id
    rows = server.service.sampler.max_rows // 4
    with sampler_held(server):
        queued, bob_request = flood_then_one(server, "/asample", [sample_request(mine, rows)] * 16,
                                             sample_request(theirs, 1))
    wait_all(server, queued, bob_request)
    after_bob = settled[settled.index(bob_request) + 1:]
    assert sum(request_id in after_bob for request_id in queued) >= 12


def test_a_models_queued_requests_never_merge_past_max_batch_datums(new_server, tmp_path, one_thread):
    """Six queued requests of 4 datums on a server that takes 8 per request: merged two at a time, all
    succeed (one batch of all 24 would be refused, failing every one of them)."""
    server = new_server(tmp_path, max_batch_datums=8)
    client = server.client()
    model = client.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    with tenant_http(server, "tml-skyrl-test") as http:
        with worker_held(server):
            queued = [http.post("/forward_backward", json=fb_request(model.model_id, 4)).json()["request_id"]
                      for _ in range(6)]
        answers = [wait_for(http, request_id) for request_id in queued]
    assert [a.headers["content-type"] for a in answers] == ["application/x-protobuf"] * 6, answers[0].text
    assert server.service.worker.batch_sizes[-3:] == [2, 2, 2]
    client.close("success").result()
    server.stop()
