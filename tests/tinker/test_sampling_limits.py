"""Sampling sessions per tenant (``--max-sampling-sessions``) and the weights they hold.

The client opens a sampling session per ``SamplingClient`` and never closes one (an RL loop opens one
a step), so past the limit the tenant's least recently used idle session is closed; only when every
one has samples queued or running is opening another a 429, which the client retries. Sessions of
one checkpoint share one loaded copy of its weights, dropped with the last of them; a session's
sampling sessions end with it.
"""

from __future__ import annotations

import gc

import pytest
import tinker
from test_fair_share import sample_request, sampler_held
from tinker import types
from tinker_helpers import ALICE, BOB, KEYS, tenant_http, train_a_little, until, wait_for, worker_held

PROMPT = types.ModelInput.from_ints([5, 6, 7])
PARAMS = types.SamplingParams(max_tokens=4, seed=0)


@pytest.fixture
def small(new_server, tmp_path, one_thread):
    server = new_server(tmp_path, api_keys=KEYS, max_sampling_sessions=2)
    yield server
    server.stop()


def open_ids(server, tenant: str) -> set[str]:
    return {s.sampling_session_id for s in list(server.service.sampling.values()) if s.tenant == tenant}


def test_a_sampler_per_step_never_hits_the_limit_and_the_least_recently_used_goes(small):
    alice = small.client(ALICE)
    trainer = alice.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    steps = [trainer.save_weights_and_get_sampling_client().result() for _ in range(5)]  # an RL loop's samplers
    assert open_ids(small, "alice") == {s._sampling_session_id for s in steps[-2:]}
    first, second = steps[-2:]
    first.sample(PROMPT, 1, PARAMS).result()  # the older one is now the more recently used
    third = alice.create_sampling_client(base_model="tiny-random").result()
    assert open_ids(small, "alice") == {first._sampling_session_id, third._sampling_session_id}
    for client in (first, third):
        assert len(client.sample(PROMPT, 1, PARAMS).result().sequences[0].tokens) == 4
    with pytest.raises(tinker.NotFoundError, match="--max-sampling-sessions"):
        second.sample(PROMPT, 1, PARAMS).result()
    alice.close("success").result()


def test_when_every_sampler_is_busy_opening_another_is_a_429_the_client_waits_out(small):
    """Busy: a sample queued, running, or done but not yet collected by the client."""
    alice, bob = small.client(ALICE), small.client(BOB)
    busy = [alice.create_sampling_client(base_model="tiny-random").result() for _ in range(2)]
    body = {"session_id": alice.holder.get_session_id(), "sampling_session_seq_id": 99, "base_model": "tiny-random"}
    with tenant_http(small, ALICE) as http:
        with sampler_held(small):
            samples = [client.sample(PROMPT, 1, PARAMS) for client in busy]
            until(lambda: small.service.futures.pending("alice") == 2)
            refused = http.post("/create_sampling_session", json=body)
            assert refused.status_code == 429 and "--max-sampling-sessions 2" in refused.json()["detail"]
            assert refused.headers["retry-after"] == "1"  # the samples finish, so the client may try again
            assert open_ids(small, "alice") == {client._sampling_session_id for client in busy}
            for _ in range(2):  # Bob's limit is his own
                bob.create_sampling_client(base_model="tiny-random").result()
            waiting = alice.create_sampling_client(base_model="tiny-random")  # retried until a sampler is idle
    assert [len(s.result().sequences[0].tokens) for s in samples] == [4, 4]  # collected: the samplers are idle
    third = waiting.result()
    assert third._sampling_session_id in open_ids(small, "alice") and len(open_ids(small, "alice")) == 2
    third.sample(PROMPT, 1, PARAMS).result()
    for client in (alice, bob):
        client.close("success").result()


def test_a_sampler_whose_result_is_not_collected_yet_stays_open(small):
    """The least recently used sampler has a finished sample nobody fetched yet: the next one goes instead."""
    alice = small.client(ALICE)
    first, second = (alice.create_sampling_client(base_model="tiny-random").result() for _ in range(2))
    with tenant_http(small, ALICE) as http:
        uncollected = http.post("/asample", json=sample_request(first._sampling_session_id, 1)).json()["request_id"]
        until(lambda: small.service.futures.get(uncollected).done)
        second.sample(PROMPT, 1, PARAMS).result()  # fetched, and acknowledged by the client's poller
        third = alice.create_sampling_client(base_model="tiny-random").result()
        assert open_ids(small, "alice") == {first._sampling_session_id, third._sampling_session_id}
        assert wait_for(http, uncollected).status_code == 200
    alice.close("success").result()


def test_sessions_of_one_checkpoint_share_its_weights_until_the_last_goes(new_server, tmp_path, one_thread):
    server = new_server(tmp_path, api_keys=KEYS)
    alice = server.client(ALICE)
    trainer = alice.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    train_a_little(trainer, 1, 1e-2)
    path = trainer.save_weights_for_sampler("shared").result().path
    clients = [alice.create_sampling_client(model_path=path).result() for _ in range(20)]
    held = {id(server.service.sampling[c._sampling_session_id].weights) for c in clients}
    assert len(held) == 1 and len(server.service.loaded_weights) == 1
    first, last = (c.sample(PROMPT, 1, PARAMS).result().sequences[0].tokens for c in (clients[0], clients[-1]))
    assert first == last

    train_a_little(trainer, 1, 1e-2)
    trainer.save_weights_for_sampler("shared").result()  # saved over: a new copy; the old sessions keep theirs
    newer = alice.create_sampling_client(model_path=path).result()
    assert server.service.sampling[newer._sampling_session_id].weights.key not in {
        server.service.sampling[c._sampling_session_id].weights.key for c in clients}
    assert len(server.service.loaded_weights) == 2

    alice.close("success").result()  # the session's sampling sessions end with it, and their weights
    gc.collect()
    assert not open_ids(server, "alice") and len(server.service.loaded_weights) == 0
    server.stop()


def test_a_sampler_saved_after_its_session_ended_is_not_left_behind(small):
    """The session ends while its save_weights_and_get_sampling_client waits for the worker: the save
    fails saying so, and no sampling session outlives the session."""
    alice = small.client(ALICE)
    trainer = alice.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    session = alice.holder.get_session_id()
    with tenant_http(small, ALICE) as http:
        with worker_held(small):
            request_id = http.post("/save_weights_for_sampler", json={
                "model_id": trainer.model_id, "sampling_session_seq_id": 1}).json()["request_id"]
            future = small.service.futures.get(request_id)
            assert http.post(f"/sessions/{session}/finish", json={}).status_code == 200
        until(lambda: future.done)
    assert "unknown or expired session" in future.error and not open_ids(small, "alice")
