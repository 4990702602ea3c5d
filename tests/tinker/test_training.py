"""Training through the real ``tinker`` client: losses and gradients against our own functions,
accumulation, learning, and isolation between two clients' adapters."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from skyrl_trainers.algorithms.policy_losses import ppo_clip_loss
from tinker import types

RANK = 4


def _datums(loss_fn: str, seed: int = 0, n: int = 3) -> list[types.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for i in range(n):
        length = 6 + 3 * i
        tokens = rng.integers(5, 500, size=length + 1).tolist()
        inputs: dict[str, object] = {"target_tokens": tokens[1:]}
        if loss_fn == "cross_entropy":
            inputs["weights"] = [0.0, 0.0] + [1.0] * (length - 2)
        else:
            inputs["logprobs"] = (-rng.uniform(4.0, 8.0, size=length)).astype(np.float32).tolist()
            inputs["advantages"] = [float(rng.normal())] * length
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs))
    return data


def _reference(state: dict[str, torch.Tensor], data: list[types.Datum], loss_fn: str, config: dict[str, float]):
    """Loss and adapter gradients computed here with a separate peft copy and full logits."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from skyrl_trainers.models import build_tiny_random

    model, _ = build_tiny_random()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ref = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0, target_modules=targets),
                         adapter_name="ref")
    set_peft_model_state_dict(ref, state, adapter_name="ref")
    total = torch.zeros(())
    lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    for datum in data:
        ids = torch.tensor([datum.model_input.to_ints()])
        inputs = {k: torch.tensor(v.data) for k, v in datum.loss_fn_inputs.items()}
        logp = torch.log_softmax(ref(input_ids=ids).logits[0].float(), -1).gather(
            -1, inputs["target_tokens"][:, None]).squeeze(-1)
        if loss_fn == "cross_entropy":
            loss = -(logp * inputs["weights"]).sum()
        else:
            q, adv = inputs["logprobs"], inputs["advantages"]
            ratio = torch.exp(logp - q)
            if loss_fn == "importance_sampling":
                loss = -(ratio * adv).sum()
            elif loss_fn == "ppo":  # our trainer's PPO clip, with Tinker's absolute thresholds
                loss = ppo_clip_loss(logp, q, adv, torch.ones_like(q), eps_low=1 - lo, eps_high=hi - 1).loss.sum()
            elif loss_fn == "cispo":
                loss = -(ratio.clamp(lo, hi).detach() * adv * logp).sum()
            else:
                loss = -(adv * logp - 0.5 * config.get("beta", 0.05) * (logp - q) ** 2).sum()
        total = total + loss
    total.backward()
    grads = {n.replace(".ref.", "."): p.grad for n, p in ref.named_parameters() if p.grad is not None}
    return float(total.detach()), grads


@pytest.mark.parametrize("loss_fn,config", [
    ("cross_entropy", {}), ("importance_sampling", {}), ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
    ("cispo", {}), ("dro", {"beta": 0.1})])
def test_loss_and_gradients_match_our_functions(server, service_client, loss_fn, config):
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=1).result()
    backend_call = server.service.worker.call
    # move the adapter off its B=0 start so every term has a gradient
    client.forward_backward(_datums("cross_entropy", seed=9), "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.05)).result()

    data = _datums(loss_fn)
    out = client.forward_backward(data, loss_fn, config or None).result()
    state = backend_call(lambda b: b.adapter_state(client.model_id))
    grads = backend_call(lambda b: b.gradients(client.model_id))
    ref_loss, ref_grads = _reference(state, data, loss_fn, config)

    assert out.metrics["loss:sum"] == pytest.approx(ref_loss, rel=1e-4, abs=1e-4)
    assert [len(o["logprobs"].data) for o in out.loss_fn_outputs] == [len(d.model_input.to_ints()) for d in data]
    assert sum(float(np.sum(o["elementwise_loss"].data)) for o in out.loss_fn_outputs) == pytest.approx(ref_loss, rel=1e-4, abs=1e-4)
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        scale = float(ref_grads[name].abs().max())
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-3, atol=1e-5 * max(scale, 1.0), msg=name)
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert backend_call(lambda b: b.gradients(client.model_id)) == {}


def test_gradients_accumulate_until_optim_step(server, service_client):
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=2).result()
    data = _datums("cross_entropy", seed=3)
    client.forward_backward(data, "cross_entropy").result()
    once = server.service.worker.call(lambda b: b.gradients(client.model_id))
    client.forward_backward(data, "cross_entropy").result()
    twice = server.service.worker.call(lambda b: b.gradients(client.model_id))
    for name in once:
        torch.testing.assert_close(twice[name], 2 * once[name], rtol=1e-5, atol=1e-7)
    # forward only: outputs, no gradient
    before = twice
    out = client.forward(data, "cross_entropy").result()
    assert out.metrics["loss:sum"] > 0
    after = server.service.worker.call(lambda b: b.gradients(client.model_id))
    for name in before:
        assert torch.equal(before[name], after[name])


def test_supervised_loss_falls_over_20_steps(service_client):
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=8, seed=0).result()
    data = _datums("cross_entropy", seed=4, n=4)
    losses = []
    for _ in range(20):
        fb = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=5e-3))
        losses.append(fb.result().metrics["loss:sum"])
        optim.result()
    assert losses[-1] < 0.5 * losses[0], losses


def test_two_clients_train_separate_adapters(server, service_client):
    import tinker

    a = service_client.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=5).result()
    other = tinker.ServiceClient(base_url=server.url, api_key="tml-skyrl-test")
    b = other.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=5).result()
    call = server.service.worker.call
    # A accumulates a gradient; B trains concurrently on other data; A's gradient and weights are untouched
    a.forward_backward(_datums("cross_entropy", seed=10), "cross_entropy").result()
    a_grads, a_state = call(lambda s: s.gradients(a.model_id)), call(lambda s: s.adapter_state(a.model_id))

    def train_b():
        for _ in range(3):
            b.forward_backward(_datums("cross_entropy", seed=11), "cross_entropy")
            b.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    thread = threading.Thread(target=train_b)
    thread.start()
    for _ in range(3):
        a.forward(_datums("cross_entropy", seed=10), "cross_entropy").result()
    thread.join()
    for name, grad in call(lambda s: s.gradients(a.model_id)).items():
        assert torch.equal(grad, a_grads[name]), name
    for name, value in call(lambda s: s.adapter_state(a.model_id)).items():
        assert torch.equal(value, a_state[name]), name
    b_state = call(lambda s: s.adapter_state(b.model_id))
    assert any(not torch.equal(b_state[k], a_state[k]) for k in a_state)
    # each sampler samples its own weights: same prompt and seed, different adapters, different logprobs
    prompt = types.ModelInput.from_ints([5, 6, 7, 8])
    params = types.SamplingParams(max_tokens=4, seed=0, temperature=1.0)
    sa = a.save_weights_and_get_sampling_client().result().sample(prompt, 1, params).result().sequences[0]
    sb = b.save_weights_and_get_sampling_client().result().sample(prompt, 1, params).result().sequences[0]
    assert sa.logprobs != sb.logprobs
    other.close("success").result()


def test_client_side_custom_loss(server, service_client):
    """forward_backward_custom runs the loss in the client (forward, then a weighted cross_entropy
    backward); a custom loss equal to cross_entropy gives cross_entropy's gradients."""
    client = service_client.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=6).result()
    data = _datums("cross_entropy", seed=12)
    client.forward_backward(_datums("cross_entropy", seed=9), "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.05)).result()
    client.forward_backward(data, "cross_entropy").result()
    expected = server.service.worker.call(lambda b: b.gradients(client.model_id))
    client.optim_step(types.AdamParams(learning_rate=0.0)).result()

    def nll(batch, logprobs):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() for d, lp in zip(batch, logprobs, strict=True))
        return loss, {}

    out = client.forward_backward_custom(data, nll).result()
    assert out.metrics["loss:sum"] > 0
    got = server.service.worker.call(lambda b: b.gradients(client.model_id))
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-5 * max(float(grad.abs().max()), 1.0))


def test_two_models_in_one_batch_get_their_own_gradients(server, service_client):
    """The worker batches different clients' forward_backward together (peft mixed-adapter rows): each
    adapter's gradient and outputs equal what its request alone gives."""
    a = service_client.create_lora_training_client(base_model="tiny-random", rank=RANK, seed=7).result()
    b = service_client.create_lora_training_client(base_model="tiny-random", rank=8, seed=8).result()
    for client, seed in ((a, 13), (b, 14)):
        client.forward_backward(_datums("cross_entropy", seed=seed), "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=0.05)).result()
    from skyrl_tinker.wire import DatumIn

    def raw(data):
        return [DatumIn(d.model_input.to_ints(), {k: np.asarray(v.data) for k, v in d.loss_fn_inputs.items()})
                for d in data]

    data_a, data_b = raw(_datums("ppo", seed=15)), raw(_datums("ppo", seed=16, n=2))

    def compare(backend):
        alone = [backend.forward_backward(a.model_id, data_a, "ppo", None),
                 backend.forward_backward(b.model_id, data_b, "ppo", None)]
        grads_alone = [backend.gradients(a.model_id), backend.gradients(b.model_id)]
        for model_id in (a.model_id, b.model_id):
            backend.optim_step(model_id, {"learning_rate": 0.0})
        together = backend.forward_backward_many([(a.model_id, data_a), (b.model_id, data_b)], "ppo", None)
        grads_together = [backend.gradients(a.model_id), backend.gradients(b.model_id)]
        return alone, grads_alone, together, grads_together

    alone, grads_alone, together, grads_together = server.service.worker.call(compare)
    for one, both in zip(alone, together, strict=True):
        assert one.metrics["loss:sum"] == pytest.approx(both.metrics["loss:sum"], rel=1e-5, abs=1e-6)
        for x, y in zip(one.outputs, both.outputs, strict=True):
            np.testing.assert_allclose(x["logprobs"], y["logprobs"], atol=1e-5)
    for g1, g2 in zip(grads_alone, grads_together, strict=True):
        assert set(g1) == set(g2)
        for name in g1:
            torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-5 * max(float(g1[name].abs().max()), 1.0))
