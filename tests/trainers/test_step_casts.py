"""A bf16 update casts each weight once per mini-batch and adds the input embedding's gradient row by row,
with the gradients of casting per micro-batch and a dense embedding gradient."""

import pytest
import torch
from skyrl_trainers.batching import TrainSample, plan_step
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.models import load_model_and_tokenizer
from skyrl_trainers.worker import TrainWorker, WorkerSpec, sparse_embedding_gradient
from skyrl_trainers.workers import free_port
from torch.utils._python_dispatch import TorchDispatchMode


def three_micro_batches(mini_batches=1):
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(2):  # two prompts of three samples: carried prompts, packed rows
        prompt_ids = torch.randint(10, 500, (6,), generator=generator).tolist()
        for advantage in (1.0, -0.5, 0.25):
            response = torch.randint(10, 500, (7,), generator=generator).tolist()
            samples.append(TrainSample(prompt_ids + response, 6, [1, 1, 0, 0, 1, 1, 1], [-3.0] * 7, advantage))
    plans = plan_step(samples, world_size=1, mini_batches=mini_batches, micro_batch_tokens=20)
    assert len(plans[0]) == mini_batches and len(plans[0][0].micro_batches) >= 3 // mini_batches
    return plans[0]


class CountWeightCasts(TorchDispatchMode):
    """Counts bf16 copies made of the given tensors (by storage)."""

    def __init__(self, tensors):
        super().__init__()
        self.names = {t.untyped_storage().data_ptr(): name for name, t in tensors}
        self.casts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            name = self.names.get(args[0].untyped_storage().data_ptr())
            if name is not None:
                self.casts[name] = self.casts.get(name, 0) + 1
        return func(*args, **kwargs)


@pytest.fixture
def worker():
    config = FSDPGRPOConfig(model="tiny-random", precision="bf16", lr=1e-2)
    rank = TrainWorker(0, 1, "127.0.0.1", free_port(), WorkerSpec(config, temperature=0.7, seed=0))
    yield rank
    rank.close()


def step_gradients(worker, monkeypatch, plans, *, cache=True, sparse=True):
    """Gradients of one ``train_step`` (the optimizer does not step, so the weights stay as they were)."""
    grads = {}

    def record():
        grads.update({name: p.grad.clone() for name, p in worker.policy.named_parameters() if p.grad is not None})
        return {}

    monkeypatch.setattr(worker, "_optimizer_step", record)
    worker.policy.get_input_embeddings().sparse = sparse
    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(cache)
    try:
        linears = [(n, p) for n, p in worker.policy.named_parameters() if n.endswith(("q_proj.weight", "up_proj.weight"))]
        with CountWeightCasts(linears) as counter:
            worker.train_step(plans)
    finally:
        torch.set_autocast_cache_enabled(previous)
    return grads, counter.casts


def test_each_weight_is_cast_once_per_mini_batch_with_the_gradients_of_casting_per_micro_batch(worker, monkeypatch):
    plans = three_micro_batches()
    micro_batches = len(plans[0].micro_batches)
    assert worker.policy.get_input_embeddings().sparse  # one unsharded rank: rows added in place

    once, casts_once = step_gradients(worker, monkeypatch, plans, cache=True, sparse=True)
    each, casts_each = step_gradients(worker, monkeypatch, plans, cache=False, sparse=False)

    layers = worker.hf_config.num_hidden_layers
    assert len(casts_once) == 2 * layers and set(casts_once.values()) == {1}
    # without the cache: at least once per micro-batch (and again in the carried prompts' runs)
    assert len(casts_each) == 2 * layers and min(casts_each.values()) >= micro_batches
    assert once.keys() == each.keys() and len(once) == len(list(worker.policy.parameters()))
    embedding = "model.embed_tokens.weight"
    assert once[embedding].abs().sum() > 0 and not once[embedding].is_sparse
    for name, grad in each.items():
        torch.testing.assert_close(once[name], grad, msg=name)


def test_each_mini_batch_casts_the_weights_again_even_inside_a_callers_autocast(worker, monkeypatch):
    """The optimizer steps between mini-batches: a cast kept past one would train on stale weights."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, casts = step_gradients(worker, monkeypatch, three_micro_batches(mini_batches=2))
    assert len(casts) == 2 * worker.hf_config.num_hidden_layers and set(casts.values()) == {2}


def test_only_a_trainable_plain_embedding_gets_sparse_gradients():
    model, _ = load_model_and_tokenizer("tiny-random", dtype=torch.float32, device="cpu")
    model.get_input_embeddings().weight.requires_grad_(False)
    assert not sparse_embedding_gradient(model) and not model.get_input_embeddings().sparse
    model.get_input_embeddings().weight.requires_grad_(True)
    assert sparse_embedding_gradient(model)

    ids = torch.tensor([[3, 5, 3]])
    model.model.embed_tokens(ids).sum().backward()
    grad = model.get_input_embeddings().weight.grad
    assert grad.is_sparse and torch.equal(grad.to_dense().abs().sum(-1).nonzero().flatten(), torch.tensor([3, 5]))
