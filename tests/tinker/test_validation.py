"""Input validation at the edge and recovery from a failed batch, with two tenants.

Every number a client sends is checked (finite, in range, the right type) before anything is queued,
with a 400 naming the field; one tenant's bad request never fails another's; a batch that fails
part-way leaves the server training exactly as a fresh one does.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import tinker
from tinker import types
from tinker_helpers import ALICE, BOB, JSON_PROMPT, KEYS, fb_body, tenant_http, tensor, until, worker_held

NAN, INF = float("nan"), float("inf")
HUGE = 10**400  # a JSON number with 401 digits: valid JSON, no float
@pytest.fixture(scope="module")
def pair(new_server, tmp_path_factory, one_thread):
    server = new_server(tmp_path_factory.mktemp("validation"), api_keys=KEYS)
    alice, bob = server.client(ALICE), server.client(BOB)
    yield server, alice, bob
    alice.close("success").result()
    bob.close("success").result()
    server.stop()


@pytest.fixture(scope="module")
def models(pair):
    _, alice, bob = pair
    return tuple(c.create_lora_training_client(base_model="tiny-random", rank=2, seed=0).result() for c in (alice, bob))


def _fb(model: str, inputs: dict, loss_fn: str = "cross_entropy", config: dict | None = None, tokens=(1, 2, 3)):
    body = fb_body(model, list(tokens), inputs, loss_fn)
    if config is not None:
        body["forward_backward_input"]["loss_fn_config"] = config
    return "/forward_backward", body


def _rl_inputs(**override) -> dict:
    return {"target_tokens": tensor([2, 3, 4]), "logprobs": tensor([-1.0] * 3, "float32"),
            "advantages": tensor([1.0] * 3, "float32"), **override}


def _optim(model: str, **params):
    return "/optim_step", {"model_id": model, "adam_params": params}


def _sample(**overrides):
    return "/asample", {"base_model": "tiny-random", "prompt": JSON_PROMPT, "num_samples": 1,
                        **{"sampling_params": {"max_tokens": 2}, **overrides}}


def _create_model(session: str, **lora):
    return "/create_model", {"session_id": session, "model_seq_id": 0, "base_model": "tiny-random",
                             "lora_config": {"rank": 2, **lora}}


# (request from (model id, session id), the field the 400 names); bodies keep NaN and Infinity literals
BAD_FIELDS = {
    "nan_target_tokens": (lambda m, s: _fb(m, {"target_tokens": tensor([NAN] * 3, "float32")}), "'target_tokens'"),
    "fractional_target_tokens": (lambda m, s: _fb(m, {"target_tokens": tensor([2.5] * 3, "float32")}),
                                 "'target_tokens'] must be whole token ids"),
    "inf_weights": (lambda m, s: _fb(m, {"target_tokens": tensor([2, 3, 4]), "weights": tensor([1, INF, 1], "float32")}),
                    "'weights'"),
    "nan_advantages": (lambda m, s: _fb(m, _rl_inputs(advantages=tensor([NAN] * 3, "float32")), "ppo"), "'advantages'"),
    "inf_logprobs": (lambda m, s: _fb(m, _rl_inputs(logprobs=tensor([-INF] * 3, "float32")), "importance_sampling"),
                     "'logprobs'"),
    "nan_loss_config": (lambda m, s: _fb(m, _rl_inputs(), "dro", {"beta": NAN}), "loss_fn_config['beta']"),
    "inf_loss_config": (lambda m, s: _fb(m, _rl_inputs(), "ppo", {"clip_high_threshold": INF}), "clip_high_threshold"),
    "null_loss_config": (lambda m, s: _fb(m, _rl_inputs(), "dro", {"beta": None}), "loss_fn_config['beta']"),
    "float_token": (lambda m, s: _fb(m, {"target_tokens": tensor([2, 3, 4])}, tokens=(1, 2.5, 3)),
                    "forward_backward_input.data[0].model_input.chunks[0].tokens[1] must be an integer"),
    "data_not_a_list": (lambda m, s: ("/forward_backward", {"model_id": m, "forward_backward_input": {
        "loss_fn": "cross_entropy", "data": {}}}), "forward_backward_input.data must be a list"),
    "inputs_not_an_object": (lambda m, s: _fb(m, []), "forward_backward_input.data[0].loss_fn_inputs must be a JSON"),
    "nan_learning_rate": (lambda m, s: _optim(m, learning_rate=NAN), "adam_params.learning_rate must be a finite"),
    "null_learning_rate": (lambda m, s: _optim(m, learning_rate=None), "adam_params.learning_rate must be a finite"),
    "text_learning_rate": (lambda m, s: _optim(m, learning_rate="fast"), "adam_params.learning_rate must be a number"),
    "negative_learning_rate": (lambda m, s: _optim(m, learning_rate=-1e-3), "adam_params.learning_rate must be >= 0"),
    "inf_beta1": (lambda m, s: _optim(m, beta1=INF), "adam_params.beta1"),
    "beta2_of_one": (lambda m, s: _optim(m, beta2=1.0), "adam_params.beta2 must be below 1"),
    "negative_eps": (lambda m, s: _optim(m, eps=-1e-8), "adam_params.eps must be >= 0"),
    "nan_weight_decay": (lambda m, s: _optim(m, weight_decay=NAN), "adam_params.weight_decay"),
    "inf_grad_clip_norm": (lambda m, s: _optim(m, grad_clip_norm=INF), "adam_params.grad_clip_norm"),
    "adam_params_not_an_object": (lambda m, s: ("/optim_step", {"model_id": m, "adam_params": [1]}),
                                  "adam_params must be a JSON object"),
    "inf_temperature": (lambda m, s: _sample(sampling_params={"temperature": INF}), "sampling_params.temperature"),
    "nan_top_p": (lambda m, s: _sample(sampling_params={"top_p": NAN}), "sampling_params.top_p"),
    "seed_above_int64": (lambda m, s: _sample(sampling_params={"seed": 2**64}), "sampling_params.seed must be an int64"),
    "seed_below_int64": (lambda m, s: _sample(sampling_params={"seed": -(2**63) - 1}), "sampling_params.seed must be an int64"),
    "seed_plus_samples_above_int64": (lambda m, s: _sample(num_samples=2, sampling_params={"seed": 2**63 - 1}),
                                      "seed + num_samples - 1 must fit an int64"),
    "text_max_tokens": (lambda m, s: _sample(sampling_params={"max_tokens": "many"}),
                        "sampling_params.max_tokens must be an integer"),
    "fractional_num_samples": (lambda m, s: _sample(num_samples=1.5), "num_samples must be an integer"),
    "inf_prompt_token": (lambda m, s: _sample(prompt={"chunks": [{"tokens": [1, INF]}]}),
                         "prompt.chunks[0].tokens[1] must be an integer"),
    "prompt_not_an_object": (lambda m, s: _sample(prompt="hello"), "prompt must be a JSON object"),
    "stop_of_objects": (lambda m, s: _sample(sampling_params={"stop": [{}]}), "sampling_params.stop[0]"),
    "text_rank": (lambda m, s: _create_model(s, rank="8"), "lora_config.rank must be an integer"),
    "huge_rank": (lambda m, s: _create_model(s, rank=10**6), "LoRA rank must be between 1 and 256"),
    "lora_seed_above_int64": (lambda m, s: _create_model(s, seed=2**64), "lora_config.seed must be an int64"),
    "text_train_attn": (lambda m, s: _create_model(s, train_attn="yes"), "lora_config.train_attn must be true or false"),
    "nan_poll_timeout": (lambda m, s: ("/retrieve_futures", {"target": {"sampling_session_id": "x"}, "timeout": NAN}),
                         "timeout must be a finite number"),
    "number_session_id": (lambda m, s: ("/session_heartbeat", {"session_id": 5}), "session_id must be a string"),
    # numbers the float32 rule refuses at the edge: a 401-digit integer is no float; 3e38 and 1e39 are finite as
    # float64; 1e-46 is positive as float64 but 0 as float32; and bounds per field, named
    "huge_int_learning_rate": (lambda m, s: _optim(m, learning_rate=HUGE), "adam_params.learning_rate must be a finite "
                               "number that fits a float32, got an integer of 401 digits"),
    "huge_int_beta1": (lambda m, s: _optim(m, beta1=-HUGE), "adam_params.beta1 must be a finite number"),
    "huge_int_loss_config": (lambda m, s: _fb(m, _rl_inputs(), "dro", {"beta": HUGE}), "loss_fn_config['beta']"),
    "huge_int_temperature": (lambda m, s: _sample(sampling_params={"temperature": HUGE}), "sampling_params.temperature"),
    "huge_int_top_p": (lambda m, s: _sample(sampling_params={"top_p": HUGE}), "sampling_params.top_p"),
    "huge_int_poll_timeout": (lambda m, s: ("/retrieve_futures", {"target": {"sampling_session_id": "x"},
                                                                  "timeout": HUGE}), "timeout must be a finite"),
    "huge_int_tensor": (lambda m, s: _fb(m, _rl_inputs(advantages=tensor([HUGE] * 3, "float32")), "ppo"),
                        "loss_fn_inputs['advantages']: data does not fit"),
    "learning_rate_3e38": (lambda m, s: _optim(m, learning_rate=3e38), "adam_params.learning_rate must be >= 0 and <= 1"),
    "weight_decay_1e39": (lambda m, s: _optim(m, weight_decay=1e39), "adam_params.weight_decay must be a finite number "
                          "that fits a float32"),
    "decay_step_over_one": (lambda m, s: _optim(m, learning_rate=0.5, weight_decay=4.0),
                            "learning_rate x adam_params.weight_decay must be at most 1"),
    "top_p_zero_as_float32": (lambda m, s: _sample(sampling_params={"top_p": 1e-46}),
                              "sampling_params.top_p must be > 0 and <= 1, got as a float32, 0.0"),
    "temperature_1e6": (lambda m, s: _sample(sampling_params={"temperature": 1e6}), "sampling_params.temperature must "
                        "be >= 0 and <= 100"),
    "dro_beta_1e39": (lambda m, s: _fb(m, _rl_inputs(), "dro", {"beta": 1e39}), "loss_fn_config['beta'] must be a finite"),
    "dro_beta_3e38": (lambda m, s: _fb(m, _rl_inputs(), "dro", {"beta": 3e38}), "loss_fn_config['beta'] must be >= 0"),
    "clip_high_1e39": (lambda m, s: _fb(m, _rl_inputs(), "ppo", {"clip_high_threshold": 1e39}), "clip_high_threshold"),
    # work per request bounded whatever the body's size: each stop string is checked at every decoding step,
    # and each clone id or acknowledged id costs the server a log or a lookup
    "too_many_stop_strings": (lambda m, s: _sample(sampling_params={"stop": ["a"] * 65}),
                              "sampling_params.stop may hold at most 64 entries, got 65"),
    "too_long_stop_string": (lambda m, s: _sample(sampling_params={"stop": ["a" * 1001]}),
                             "sampling_params.stop strings may have at most 1000 characters"),
    "clone_id_past_the_limit": (lambda m, s: ("/retrieve_futures", {"target": {"sampling_session_id": "x",
                                                                              "cloned_sampler_id": 10**6}}),
                                "cloned_sampler_id must be >= 0 and <= 1023"),
    "too_many_acknowledged_ids": (lambda m, s: ("/retrieve_futures", {"target": {"sampling_session_id": "x"},
                                                                      "retrieved_request_ids": ["r"] * 4097}),
                                  "retrieved_request_ids may hold at most 4096 entries"),
    "clip_low_above_one": (lambda m, s: _fb(m, _rl_inputs(), "cispo", {"clip_low_threshold": 2.0}), "clip_low_threshold"),
    "list_model_id": (lambda m, s: ("/get_info", {"model_id": [m]}), "model_id must be a string"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_a_bad_field_is_a_400_naming_it(pair, models, case):
    server, alice, _ = pair
    build, field = BAD_FIELDS[case]
    path, body = build(models[0].model_id, alice.holder.get_session_id())
    with tenant_http(server, ALICE) as http:
        response = http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert field in response.json()["detail"], response.text


def test_bad_numbers_through_the_client(pair, models):
    alice_model = models[0]
    tokens = [1, 2, 3, 4]

    def datum(**inputs) -> types.Datum:
        return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                           loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "logprobs": [-1.0] * 4,
                                           "advantages": [0.5] * 4, **inputs})

    for inputs, loss, config, field in [({"advantages": [NAN] * 4}, "ppo", None, "'advantages'"),
                                        ({"logprobs": [0.0, INF, 0.0, 0.0]}, "importance_sampling", None, "'logprobs'"),
                                        ({}, "dro", {"beta": NAN}, "loss_fn_config['beta']")]:
        with pytest.raises(tinker.BadRequestError, match=re.escape(field)):
            alice_model.forward_backward([datum(**inputs)], loss, config).result()
    with pytest.raises(tinker.BadRequestError, match=r"adam_params\.learning_rate"):  # the client sends NaN as null
        alice_model.optim_step(types.AdamParams(learning_rate=NAN)).result()
    with pytest.raises(tinker.BadRequestError, match=r"adam_params\.eps"):
        alice_model.optim_step(types.AdamParams(eps=-INF)).result()
    with pytest.raises(tinker.BadRequestError, match=r"adam_params\.learning_rate must be >= 0 and <= 1"):
        alice_model.optim_step(types.AdamParams(learning_rate=3e38)).result()
    with pytest.raises(tinker.BadRequestError, match=r"adam_params\.weight_decay must be a finite number"):
        alice_model.optim_step(types.AdamParams(weight_decay=1e39)).result()
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_config\['beta'\] must be a finite number"):
        alice_model.forward_backward([datum()], "dro", {"beta": 1e39}).result()
    sampler = alice_model.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match=r"sampling_params\.seed must be an int64"):
        sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=2, seed=2**64)).result()
    with pytest.raises(tinker.BadRequestError, match=r"sampling_params\.top_p must be > 0"):
        sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=2, top_p=1e-46)).result()


def test_a_tiny_temperature_samples_the_likeliest_tokens_not_the_vocabularys_last(pair, models):
    """A temperature of 1e-40 is a valid float32; dividing logits by it overflowed to NaN, and every sample
    was the last id of the vocabulary. It now samples as the smallest temperature the engine divides by."""
    server, alice, _ = pair
    sampler = alice.create_sampling_client(base_model="tiny-random")
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])

    def sample(temperature: float) -> list[int]:
        params = types.SamplingParams(max_tokens=8, temperature=temperature, seed=3)
        return list(sampler.sample(prompt, 1, params).result().sequences[0].tokens)

    vocab_last = server.service.backend.vocab_size - 1
    tiny = sample(1e-40)
    assert tiny == sample(0.0) and set(tiny) != {vocab_last}, (tiny, vocab_last)


def test_one_tenants_bad_rows_do_not_fail_anothers_request(pair, models):
    """Bob's request is queued behind Alice's bad one (the worker is held, so the two would share a
    batch): Alice gets her 400 at once, Bob's request succeeds with what it gives alone."""
    server, _, _ = pair
    alice_model, bob_model = models
    data = [types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0, 1.0, 0.5, 0.5]})]
    bad = [types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                       loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [NAN] * 4})]
    with worker_held(server):
        theirs = bob_model.forward_backward(data, "cross_entropy")
        until(lambda: server.service.futures.pending("bob") == 1)
        with pytest.raises(tinker.BadRequestError, match="'weights'"):
            alice_model.forward_backward(bad, "cross_entropy").result()
    loss = theirs.result().metrics["loss:sum"]
    assert math.isfinite(loss) and loss == bob_model.forward(data, "cross_entropy").result().metrics["loss:sum"]


def test_an_applied_optim_step_is_reported_as_applied_even_with_non_finite_metrics(pair):
    """Advantages of 3e38 are finite, but the summed loss overflows and the gradient norm is not: the
    step is applied (Tinker does not skip it) and reported as applied, its grad norm as it is."""
    _, alice, _ = pair
    model = alice.create_lora_training_client(base_model="tiny-random", rank=2, seed=1).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(list(range(5, 21))),
                        loss_fn_inputs={"target_tokens": list(range(6, 22)), "logprobs": [-1.0] * 16,
                                        "advantages": [3e38] * 16})
    model.forward_backward([datum], "importance_sampling").result()
    metrics = model.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics
    assert not math.isfinite(metrics["grad_norm:mean"]) and metrics["step:max"] == 1.0, metrics
    assert model.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics["step:max"] == 2.0


class FaultOnce:
    """Raises from the first decoder layer on its ``nth`` forward from now, once: a stand-in, inside
    the real model, for what can still fail a validated batch (running out of memory)."""

    def __init__(self, server, nth: int) -> None:
        layer = dict(server.service.backend.peft.named_modules())["base_model.model.model.layers.0"]
        self.calls, self.nth, self.fired = 0, nth, False
        self.handle = layer.register_forward_pre_hook(self)

    def __call__(self, module, args) -> None:
        self.calls += 1
        if self.calls == self.nth:
            self.fired = True
            raise RuntimeError("injected fault")

    def __enter__(self) -> FaultOnce:
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _data(seed: int, n: int) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(5, 500, size=9).tolist()
        out.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                               loss_fn_inputs={"target_tokens": tokens[1:]}))
    return out


PROBE = _data(99, 2)


def _outputs(result) -> tuple[float, list[list[float]]]:
    """A forward(_backward) result's loss and per-datum logprobs."""
    return result.metrics["loss:sum"], [list(o["logprobs"].data) for o in result.loss_fn_outputs]


def _step(model, data) -> tuple[tuple, tuple]:
    """forward_backward, optim_step, then the probe's logprobs under the new weights."""
    out = _outputs(model.forward_backward(data, "cross_entropy").result())
    model.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return out, _outputs(model.forward(PROBE, "cross_entropy").result())


def test_training_after_a_failed_batch_equals_a_fresh_servers(new_server, tmp_path, one_thread):
    """Two tenants' requests share a batch of micro-batches; the second micro-batch fails after the
    first one's backward (its adapters routed row by row). The batch is run again one model at a time,
    and each model's outputs, and its weights after the step, are those of a fresh server. Then a
    request of Alice's fails on its own: it fails, and her next request again equals a fresh server's."""
    data_a, data_b, data_a2 = _data(1, 2), _data(2, 2), _data(3, 4)

    fresh = new_server(tmp_path / "fresh")
    try:
        fresh.service.backend.micro_batch_tokens = 16  # two 8-token rows per micro-batch
        client = fresh.client()
        a, b = (client.create_lora_training_client(base_model="tiny-random", rank=4, seed=s).result() for s in (1, 2))
        expected = [_step(a, data_a), _step(b, data_b), _step(a, data_a2)]
        client.close("success").result()
    finally:
        fresh.stop()

    server = new_server(tmp_path / "faulty", api_keys=KEYS)
    try:
        server.service.backend.micro_batch_tokens = 16
        alice, bob = server.client(ALICE), server.client(BOB)
        a = alice.create_lora_training_client(base_model="tiny-random", rank=4, seed=1).result()
        b = bob.create_lora_training_client(base_model="tiny-random", rank=4, seed=2).result()
        with FaultOnce(server, nth=2) as fault:  # the shared batch's second micro-batch
            with worker_held(server):
                futures = [a.forward_backward(data_a, "cross_entropy"), b.forward_backward(data_b, "cross_entropy")]
                until(lambda: server.service.futures.pending("alice") == server.service.futures.pending("bob") == 1)
            outputs = [_outputs(f.result()) for f in futures]
        assert fault.fired and server.service.worker.batch_sizes[-3:] == [2, 1, 1]  # shared, then one model each
        for model in (a, b):
            model.optim_step(types.AdamParams(learning_rate=0.05)).result()
        got = [(outputs[0], _outputs(a.forward(PROBE, "cross_entropy").result())),
               (outputs[1], _outputs(b.forward(PROBE, "cross_entropy").result()))]
        with FaultOnce(server, nth=2) as fault, pytest.raises(tinker.RequestFailedError, match="injected fault"):
            a.forward_backward(data_a2, "cross_entropy").result()  # its own second micro-batch
        assert fault.fired
        got.append(_step(a, data_a2))
        for client in (alice, bob):
            client.close("success").result()
    finally:
        server.stop()
    for outputs, want in zip(got, expected, strict=True):
        for (loss, logprobs), (want_loss, want_logprobs) in zip(outputs, want, strict=True):  # fb, then probe
            assert loss == pytest.approx(want_loss, rel=0, abs=1e-5)
            np.testing.assert_allclose(logprobs, want_logprobs, rtol=0, atol=1e-6)
