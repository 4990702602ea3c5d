"""serve --seed: what requests leave unseeded (sampling, LoRA initialisation) repeats on a fresh server,
repeated identical requests still differ, and a request's own seed wins."""

from __future__ import annotations

import numpy as np
from skyrl_core.engine import SamplingParams
from skyrl_tinker.seeds import ServerSeeds
from tinker import types

PROMPT = [5, 17, 42, 99, 7]
UNSEEDED = types.SamplingParams(max_tokens=8, temperature=1.0)


def _run(server) -> tuple[list, list, list, float]:
    """Unseeded samples of a fresh adapter (twice the same request), a seeded one, and the adapter's first loss."""
    service = server.client()
    try:
        client = service.create_lora_training_client(base_model="tiny-random", rank=4).result()
        probe = [types.Datum(model_input=types.ModelInput.from_ints(PROMPT[:-1]),
                             loss_fn_inputs={"target_tokens": PROMPT[1:]})]
        client.forward_backward(probe, "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-1)).result()  # the update depends on lora_A's init
        loss = client.forward(probe, "cross_entropy").result().metrics["loss:sum"]
        sampler = client.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(PROMPT)
        first, second = (sampler.sample(prompt, 4, UNSEEDED).result().sequences for _ in range(2))
        seeded = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)).result()
        tokens = [[list(s.tokens) for s in sequences] for sequences in (first, second, seeded.sequences)]
        return *tokens, loss
    finally:
        service.close("success").result()


def test_a_seeded_server_repeats_what_requests_leave_unseeded(tmp_path, new_server):
    runs = []
    for name in ("a", "b"):
        server = new_server(tmp_path / name, seed=123)
        try:
            runs.append(_run(server))
        finally:
            server.stop()
    (first, second, seeded, loss), (first_b, second_b, seeded_b, loss_b) = runs
    assert first == first_b and second == second_b  # unseeded samples repeat on a fresh server
    np.testing.assert_allclose(loss, loss_b, rtol=1e-6)  # so does the unseeded adapter's initialisation
    assert first != second  # a repeated request is not the same draw
    assert seeded == seeded_b


def test_request_seeds_depend_on_the_server_seed_the_request_and_its_repeat():
    params = SamplingParams(max_tokens=8, temperature=1.0)
    one, other = ServerSeeds(1), ServerSeeds(2)
    first, again = one.for_sample("a", PROMPT, params, 4), one.for_sample("a", PROMPT, params, 4)
    assert first != again
    assert ServerSeeds(1).for_sample("a", PROMPT, params, 4) == first
    assert other.for_sample("a", PROMPT, params, 4) != first
    assert ServerSeeds(1).for_sample("a", PROMPT[:-1], params, 4) != first
    assert ServerSeeds(1).for_sample("a", PROMPT, params.model_copy(update={"temperature": 0.5}), 4) != first
    assert all(0 <= seed < 2**56 for seed in (first, again))
    assert ServerSeeds(1).for_adapter("a") == ServerSeeds(1).for_adapter("a") != ServerSeeds(2).for_adapter("a")


def test_one_tenants_requests_never_shift_the_seeds_of_another():
    params = SamplingParams(max_tokens=8, temperature=1.0)
    alone, shared = ServerSeeds(1), ServerSeeds(1)
    expected = [alone.for_sample("a", PROMPT, params, 4) for _ in range(3)] + [alone.for_adapter("a") for _ in range(2)]
    got = []
    for _ in range(3):
        shared.for_sample("b", PROMPT, params, 4)  # the same request from another tenant, in between
        got.append(shared.for_sample("a", PROMPT, params, 4))
    for _ in range(2):
        shared.for_adapter("b")
        got.append(shared.for_adapter("a"))
    assert got == expected
    assert ServerSeeds(1).for_sample("b", PROMPT, params, 4) != expected[0]  # and tenants do not share draws


def test_another_tenants_flood_never_evicts_a_tenants_repeat_counts(monkeypatch):
    import skyrl_tinker.seeds as seeds

    monkeypatch.setattr(seeds, "_REMEMBERED", 4)
    params = SamplingParams(max_tokens=8, temperature=1.0)
    server = ServerSeeds(1)
    first = server.for_sample("a", PROMPT, params, 4)
    for token in range(10):  # more distinct requests than are remembered
        server.for_sample("b", [token], params, 4)
    assert server.for_sample("a", PROMPT, params, 4) != first  # a's repeat was still counted
