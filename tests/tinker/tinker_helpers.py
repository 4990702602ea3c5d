"""Steps shared by the tinker tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import httpx
from skyrl_tinker.worker import Job
from tinker import types

# two tenants, for servers started with api_keys=KEYS
ALICE, BOB = "tml-alice-0123456789abcdef", "tml-bob-0123456789abcdef00"
KEYS = {ALICE: "alice", BOB: "bob"}
JSON_PROMPT = {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]}  # an asample prompt, raw HTTP


def train_a_little(client, steps: int, learning_rate: float) -> None:
    """``steps`` of cross-entropy + Adam on one fixed 19-token datum, through the client."""
    tokens = list(range(20, 40))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:]})
    for _ in range(steps):
        client.forward_backward([datum], "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=learning_rate)).result()


def wait_for(http: httpx.Client, request_id: str) -> httpx.Response:
    """The ``retrieve_future`` answer for ``request_id`` once it is not ``try_again`` (raw HTTP)."""
    while True:
        response = http.post("/retrieve_future", json={"request_id": request_id})
        if response.headers.get("content-type") != "application/json" or response.json().get("type") != "try_again":
            return response


def fb_body(model_id: str, tokens: list[int], inputs: dict, loss_fn: str = "cross_entropy") -> dict:
    """A JSON ``forward_backward`` body with one datum."""
    return {"model_id": model_id, "seq_id": 1, "forward_backward_input": {
        "loss_fn": loss_fn, "data": [{"model_input": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
                                      "loss_fn_inputs": inputs}]}}


def tensor(values: list, dtype: str = "int64") -> dict:
    """A JSON ``TensorData``."""
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def tenant_http(server, key: str) -> httpx.Client:
    """Raw HTTP to ``server``'s API as the tenant of ``key``, every request labelled JSON as the tinker client's are
    (a body-less POST without a JSON type is refused: a web page sends those)."""
    return httpx.Client(base_url=f"{server.url}/api/v1", headers={"X-API-Key": key, "Content-Type": "application/json"},
                        timeout=60)


def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (a state the server reaches, not a time); fail after 60 s."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in 60 s"
        time.sleep(0.01)


@contextlib.contextmanager
def worker_held(server) -> Iterator[None]:
    """Keep the training worker busy, so requests sent meanwhile queue up and then run as one batch."""
    gate = threading.Event()
    server.service.worker.submit(Job(None, None, run=lambda _backend: gate.wait()))
    try:
        yield
    finally:
        gate.set()
