"""Two tenants on one server (``--api-keys``): neither reaches the other's sessions, models, samplers,
requests or checkpoints (404, answered exactly as for an id that does not exist) unless a checkpoint
is published; ids outside the run-id pattern never reach the filesystem; per-tenant limits are 429s.

Through the real ``tinker`` client where it can address another tenant's objects, raw HTTP (httpx,
``http.client`` for paths httpx would normalise) for the rest.
"""

from __future__ import annotations

import http.client
import json
import secrets
import shutil
from collections.abc import Callable

import pytest
import tinker
from skyrl_tinker.checkpoints import new_run_id
from tinker import types
from tinker_helpers import (
    ALICE,
    BOB,
    JSON_PROMPT,
    KEYS,
    fb_body,
    tenant_http,
    tensor,
    train_a_little,
    wait_for,
    worker_held,
)


@pytest.fixture(scope="module")
def pair(new_server, tmp_path_factory, one_thread):
    """A two-tenant server; Alice owns a trained model, two checkpoints, a sampler and a request."""
    root = tmp_path_factory.mktemp("tenants")
    server = new_server(root / "checkpoints", api_keys=KEYS)
    alice, bob = server.client(ALICE), server.client(BOB)
    trainer = alice.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    train_a_little(trainer, 1, 1e-2)
    sampling = trainer.save_weights_and_get_sampling_client().result()
    bob_trainer = bob.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result()
    with tenant_http(server, ALICE) as http:
        forward = http.post("/forward", json=fb_body(trainer.model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4])}))
        wait_for(http, forward.json()["request_id"])
    ids = {"model": trainer.model_id, "run": trainer.model_id, "session": alice.holder.get_session_id(),
           "sampler": sampling._sampling_session_id, "request": forward.json()["request_id"],
           "state": trainer.save_state("s1").result().path, "weights": trainer.save_weights_for_sampler("w1").result().path,
           "bob_model": bob_trainer.model_id, "bob_session": bob.holder.get_session_id()}
    yield server, alice, bob, trainer, ids, root
    alice.close("success").result()
    bob.close("success").result()
    server.stop()


def _fake_ids(ids: dict[str, str]) -> dict[str, str]:
    """Ids of the same shapes that were never issued."""
    run = new_run_id()
    return {**ids, "model": run, "run": run, "session": f"s-{secrets.token_hex(16)}",
            "sampler": f"smp-{secrets.token_hex(16)}", "request": secrets.token_hex(16),
            "state": f"tinker://{run}/weights/s1", "weights": f"tinker://{run}/sampler_weights/w1"}


# every request that names one of Alice's objects: (method, path, JSON body) from the ids
CROSS_TENANT: dict[str, Callable[[dict[str, str]], tuple[str, str, dict | None]]] = {
    "get_info": lambda i: ("POST", "/get_info", {"model_id": i["model"]}),
    "forward_backward": lambda i: ("POST", "/forward_backward", fb_body(i["model"], [1, 2, 3],
                                                                        {"target_tokens": tensor([2, 3, 4])})),
    "forward": lambda i: ("POST", "/forward", fb_body(i["model"], [1, 2, 3], {"target_tokens": tensor([2, 3, 4])})),
    "optim_step": lambda i: ("POST", "/optim_step", {"model_id": i["model"], "adam_params": {"learning_rate": 0.5}}),
    "save_weights": lambda i: ("POST", "/save_weights", {"model_id": i["model"], "path": "s1", "overwrite": True}),
    "save_weights_for_sampler": lambda i: ("POST", "/save_weights_for_sampler", {"model_id": i["model"], "path": "x"}),
    "save_weights_for_sampler_session": lambda i: ("POST", "/save_weights_for_sampler",
                                                   {"model_id": i["model"], "sampling_session_seq_id": 9}),
    "load_weights_into_their_model": lambda i: ("POST", "/load_weights", {"model_id": i["model"], "path": i["state"]}),
    "load_their_checkpoint": lambda i: ("POST", "/load_weights", {"model_id": i["bob_model"], "path": i["state"]}),
    "create_model_from_their_checkpoint": lambda i: ("POST", "/load_weights", {
        "session_id": i["bob_session"], "model_seq_id": 7, "path": i["state"], "optimizer": True}),
    "unload_model": lambda i: ("POST", "/unload_model", {"model_id": i["model"]}),
    "create_model_in_their_session": lambda i: ("POST", "/create_model", {
        "session_id": i["session"], "model_seq_id": 0, "base_model": "tiny-random", "lora_config": {"rank": 2}}),
    "create_sampling_session_in_their_session": lambda i: ("POST", "/create_sampling_session", {
        "session_id": i["session"], "sampling_session_seq_id": 0, "base_model": "tiny-random"}),
    "create_sampling_session_from_their_checkpoint": lambda i: ("POST", "/create_sampling_session", {
        "session_id": i["bob_session"], "sampling_session_seq_id": 0, "model_path": i["weights"]}),
    "sampler_info": lambda i: ("GET", f"/samplers/{i['sampler']}", None),
    "sample_their_sampler": lambda i: ("POST", "/asample", {"sampling_session_id": i["sampler"], "prompt": JSON_PROMPT,
                                                            "sampling_params": {"max_tokens": 1}}),
    "sample_their_checkpoint": lambda i: ("POST", "/asample", {"model_path": i["weights"], "prompt": JSON_PROMPT,
                                                               "sampling_params": {"max_tokens": 1}}),
    "retrieve_futures": lambda i: ("POST", "/retrieve_futures", {
        "target": {"type": "sampling_session", "sampling_session_id": i["sampler"]}, "timeout": 0}),
    "retrieve_future": lambda i: ("POST", "/retrieve_future", {"request_id": i["request"]}),
    "cancel_future": lambda i: ("POST", "/cancel_future", {"request_id": i["request"]}),
    "finish_session": lambda i: ("POST", f"/sessions/{i['session']}/finish", {}),
    "training_run": lambda i: ("GET", f"/training_runs/{i['run']}", None),
    "list_checkpoints": lambda i: ("GET", f"/training_runs/{i['run']}/checkpoints", None),
    "delete_checkpoint": lambda i: ("DELETE", f"/training_runs/{i['run']}/checkpoints/weights/s1", None),
    "publish_checkpoint": lambda i: ("POST", f"/training_runs/{i['run']}/checkpoints/weights/s1/publish", None),
    "unpublish_checkpoint": lambda i: ("DELETE", f"/training_runs/{i['run']}/checkpoints/weights/s1/publish", None),
    "weights_info": lambda i: ("POST", "/weights_info", {"tinker_path": i["state"]}),
    "session_heartbeat": lambda i: ("POST", "/session_heartbeat", {"session_id": i["session"]}),
}


def _without_ids(text: str, ids: dict[str, str]) -> str:
    for name, value in sorted(ids.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(value, f"<{name}>")
    return text


def _alice_state(server, ids: dict[str, str]) -> tuple:
    """What Bob must not change: Alice's weights and gradients, checkpoints (and who may read them),
    session, model and sampler."""
    with tenant_http(server, ALICE) as http:
        assert http.post("/session_heartbeat", json={"session_id": ids["session"]}).status_code == 200
        assert http.post("/get_info", json={"model_id": ids["model"]}).status_code == 200
        assert http.get(f"/samplers/{ids['sampler']}").status_code == 200
        checkpoints = http.get(f"/training_runs/{ids['run']}/checkpoints").json()["checkpoints"]
    weights = server.service.worker.call(lambda b: (b.adapter_state(ids["model"]), b.gradients(ids["model"])))
    return (sorted((c["tinker_path"], c["public"], c["time"]) for c in checkpoints),
            {k: v.tolist() for part in weights for k, v in part.items()})


@pytest.mark.parametrize("operation", list(CROSS_TENANT))
def test_another_tenants_objects_are_unknown(pair, operation):
    """Bob gets for Alice's id exactly what he gets for an id nobody has (404; 410 for a heartbeat,
    the status the client reads as a finished session), and Alice's objects are untouched."""
    server, _, _, _, ids, _ = pair
    before = _alice_state(server, ids)
    fake = _fake_ids(ids)
    answers = []
    with tenant_http(server, BOB) as http:
        for id_set in (ids, fake):
            method, path, body = CROSS_TENANT[operation](id_set)
            response = http.request(method, path, json=body)
            answers.append((response.status_code, _without_ids(response.text, id_set)))
    assert answers[0] == answers[1], answers
    assert answers[0][0] == (410 if operation == "session_heartbeat" else 404), answers
    assert _alice_state(server, ids) == before


def test_another_tenants_objects_through_the_client(pair):
    server, alice, bob, trainer, ids, _ = pair
    rest = tinker.RestClient(base_url=server.url, api_key=BOB)
    refused = {
        "get_training_run": lambda: rest.get_training_run(ids["run"]).result(),
        "list_checkpoints": lambda: rest.list_checkpoints(ids["run"]).result(),
        "delete_checkpoint": lambda: rest.delete_checkpoint_from_tinker_path(ids["state"]).result(),
        "weights_info": lambda: rest.get_weights_info_by_tinker_path(ids["state"]).result(),
        "publish": lambda: rest.publish_checkpoint_from_tinker_path(ids["weights"]).result(),
        "get_sampler": lambda: rest.get_sampler(ids["sampler"]).result(),
        "sampling_client": lambda: bob.create_sampling_client(model_path=ids["weights"]).result(),
        "training_client": lambda: bob.create_training_client_from_state_with_optimizer(ids["state"]).result(),
    }
    for name, call in refused.items():
        with pytest.raises(tinker.NotFoundError) as error:
            call()
        assert error.value.status_code == 404, name
    assert ids["run"] not in [r.training_run_id for r in rest.list_training_runs().result().training_runs]
    mine = tinker.RestClient(base_url=server.url, api_key=ALICE).list_training_runs().result().training_runs
    assert {r.training_run_id: r.model_owner for r in mine}[ids["run"]] == "alice"
    assert ids["bob_model"] not in [r.training_run_id for r in mine]
    # and Alice goes on as before
    train_a_little(trainer, 1, 1e-2)


def test_a_published_checkpoint_can_be_loaded_and_sampled_by_another_tenant(pair):
    server, alice, bob, _, ids, _ = pair
    alice_rest = tinker.RestClient(base_url=server.url, api_key=ALICE)
    bob_rest = tinker.RestClient(base_url=server.url, api_key=BOB)
    params = types.SamplingParams(max_tokens=6, seed=3)
    prompt = types.ModelInput.from_ints([5, 6, 7])
    theirs = alice.create_sampling_client(model_path=ids["weights"]).result().sample(prompt, 2, params).result()
    for path in (ids["weights"], ids["state"]):
        alice_rest.publish_checkpoint_from_tinker_path(path).result()
        alice_rest.publish_checkpoint_from_tinker_path(path).result()  # publishing is idempotent
    listed = {c.tinker_path: c.public for c in alice_rest.list_checkpoints(ids["run"]).result().checkpoints}
    assert listed[ids["weights"]] and listed[ids["state"]]
    mine = bob.create_sampling_client(model_path=ids["weights"]).result().sample(prompt, 2, params).result()
    assert [s.tokens for s in mine.sequences] == [s.tokens for s in theirs.sequences]
    assert bob_rest.get_weights_info_by_tinker_path(ids["state"]).result().lora_rank == 2
    copy = bob.create_training_client_from_state_with_optimizer(ids["state"]).result()  # Bob's own model
    saved = copy.save_state("bobs").result().path
    assert not saved.startswith(f"tinker://{ids['run']}/")
    assert bob_rest.get_training_run_by_tinker_path(saved).result().model_owner == "bob"
    for call in (lambda: bob_rest.list_checkpoints(ids["run"]).result(),
                 lambda: bob_rest.delete_checkpoint_from_tinker_path(ids["weights"]).result(),
                 lambda: bob_rest.unpublish_checkpoint_from_tinker_path(ids["weights"]).result()):
        with pytest.raises(tinker.NotFoundError):
            call()
    for path in (ids["weights"], ids["state"]):
        alice_rest.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError):
        bob.create_sampling_client(model_path=ids["weights"]).result()


BAD_RUN_IDS = ["..", ".", "...", "a..b", "../checkpoints", "x/../..", "%2e%2e", "run\n", "-x", "a" * 200]


def test_run_ids_outside_the_pattern_never_reach_the_filesystem(pair):
    """A run id of '..' would name the folder above the checkpoint dir: a run and a checkpoint are
    planted there, and no route reads, lists or deletes them."""
    server, _, _, _, ids, root = pair
    run_json = json.loads((root / "checkpoints" / ids["run"] / "run.json").read_text())
    (root / "run.json").write_text(json.dumps({**run_json, "owner": "alice"}))
    planted = root / "weights" / "s1"
    shutil.copytree(root / "checkpoints" / ids["run"] / "weights" / "s1", planted)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"X-API-Key": ALICE, "Content-Type": "application/json"}

    def send(method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        connection.request(method, f"/api/v1{path}", body=None if body is None else json.dumps(body), headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()

    for run_id in BAD_RUN_IDS:
        raw = run_id.replace("\n", "%0A")
        path = f"tinker://{run_id}/weights/s1"
        answers = {
            "training_run": send("GET", f"/training_runs/{raw}"),
            "list_checkpoints": send("GET", f"/training_runs/{raw}/checkpoints"),
            "delete_checkpoint": send("DELETE", f"/training_runs/{raw}/checkpoints/weights/s1"),
            "publish": send("POST", f"/training_runs/{raw}/checkpoints/weights/s1/publish"),
            "unpublish": send("DELETE", f"/training_runs/{raw}/checkpoints/weights/s1/publish"),
            "weights_info": send("POST", "/weights_info", {"tinker_path": path}),
            "load_weights": send("POST", "/load_weights", {"model_id": ids["model"], "path": path}),
            "create_via_load": send("POST", "/load_weights", {"session_id": ids["session"], "path": path}),
            "sampling_session": send("POST", "/create_sampling_session", {"session_id": ids["session"],
                                                                          "model_path": path}),
            "sample": send("POST", "/asample", {"model_path": path, "prompt": JSON_PROMPT}),
        }
        for route, (status, text) in answers.items():
            assert status in (400, 404), (run_id, route, status, text)
    listed = send("GET", "/training_runs?limit=100")[1]
    assert '"training_run_id":".."' not in listed and ids["run"] in listed
    assert planted.exists() and (root / "run.json").exists()
    assert not json.loads((planted / "meta.json").read_text()).get("public")
    connection.close()


@pytest.fixture
def small_limits(new_server, tmp_path, one_thread):
    server = new_server(tmp_path, api_keys=KEYS, max_sessions=2, max_adapters=1, max_queued_requests=2)
    yield server
    server.stop()


def test_each_tenant_has_its_own_limits(small_limits):
    server = small_limits
    alice = [server.client(ALICE) for _ in range(3)]
    for client in alice[:2]:
        client.holder.get_session_id()  # a ServiceClient opens its session when first used
    with pytest.raises(tinker.RateLimitError, match=r"--max-sessions 2"):
        alice[2].holder.get_session_id()
    bob = server.client(BOB)  # Bob's sessions are his own
    model = alice[0].create_lora_training_client(base_model="tiny-random", rank=2).result()
    with pytest.raises(tinker.RateLimitError, match=r"--max-adapters 1"):
        alice[1].create_lora_training_client(base_model="tiny-random", rank=2).result()
    bob_model = bob.create_lora_training_client(base_model="tiny-random", rank=2).result()

    body = fb_body(model.model_id, [1, 2, 3], {"target_tokens": tensor([2, 3, 4])})
    with tenant_http(server, ALICE) as http, tenant_http(server, BOB) as bob_http, worker_held(server):
        queued = [http.post("/forward", json=body) for _ in range(2)]
        assert [r.status_code for r in queued] == [200, 200]
        third = http.post("/forward", json=body)
        assert third.status_code == 429 and "--max-queued-requests 2" in third.json()["detail"]
        assert third.headers["retry-after"] == "1"  # the client waits and sends it again
        theirs = bob_http.post("/forward", json=fb_body(bob_model.model_id, [1, 2, 3],
                                                        {"target_tokens": tensor([2, 3, 4])}))
        assert theirs.status_code == 200
    with tenant_http(server, ALICE) as http:
        for response in queued:
            assert wait_for(http, response.json()["request_id"]).status_code == 200
        assert http.post("/forward", json=body).status_code == 200  # the queue drained
    alice[0].close("success").result()  # its model goes with it, so the other session may make one
    alice[1].create_lora_training_client(base_model="tiny-random", rank=2).result()
    for client in (alice[1], bob):
        client.close("success").result()
