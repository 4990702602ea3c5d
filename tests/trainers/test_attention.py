"""In bf16 on CPU the packed rows' attention runs as two matmuls that autograd differentiates, with the
numbers of PyTorch's fused kernel (see ``skyrl_trainers.forward._bf16_cpu_attention``)."""

import pytest
import torch
import torch.nn.functional as F
from skyrl_trainers import forward
from skyrl_trainers.batching import TrainSample
from skyrl_trainers.forward import _bf16_cpu_attention, collate, token_logprobs
from skyrl_trainers.models import build_tiny_random
from skyrl_trainers.prompt_cache import PromptCache


def leaf(*shape, generator):
    return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()


def output_and_grads(attend, q, k, v, weights):
    for t in (q, k, v):
        t.grad = None
    out = attend()
    (out.double() * weights).sum().backward()
    return [out.detach().double(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


@pytest.mark.parametrize("masked", [True, False], ids=["4d-mask", "causal"])
def test_matmul_attention_matches_sdpa_with_grouped_key_heads(masked):
    generator = torch.Generator().manual_seed(0)
    rows, length, keys = (2, 30, 50) if masked else (1, 40, 40)
    q, k, v = leaf(rows, 9, length, 64, generator=generator), *(leaf(rows, 3, keys, 64, generator=generator)
                                                              for _ in range(2))
    mask = torch.rand(rows, 1, length, keys, generator=generator) < 0.7 if masked else None
    if masked:
        mask[..., 0] = True  # every query sees a key (sdpa would give NaN otherwise)
    weights = torch.randn(rows, 9, length, 64, dtype=torch.float64, generator=generator)
    mine = output_and_grads(lambda: _bf16_cpu_attention(q, k, v, mask, None), q, k, v, weights)
    exact = output_and_grads(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked,
                                                                     enable_gqa=True), q, k, v, weights)
    assert mine[0].shape == (rows, 9, length, 64)
    for got, want in zip(mine, exact, strict=True):
        # bf16 keeps 8 bits of mantissa: about 1 % of the largest value
        torch.testing.assert_close(got, want, rtol=0, atol=0.02 * float(want.abs().max()))


def test_a_query_with_no_visible_key_averages_the_values_instead_of_giving_nan():
    generator = torch.Generator().manual_seed(1)
    q, k, v = leaf(1, 2, 4, 8, generator=generator), leaf(1, 1, 5, 8, generator=generator), \
        leaf(1, 1, 5, 8, generator=generator)
    mask = torch.ones(1, 1, 4, 5, dtype=torch.bool).tril()
    mask[0, 0, 2] = False
    out = _bf16_cpu_attention(q, k, v, mask, None)
    out.sum().backward()
    assert all(torch.isfinite(t).all() for t in (out, q.grad, k.grad, v.grad))
    torch.testing.assert_close(out[0, :, 2].double(), v[0, 0].detach().mean(0).expand(2, 8), rtol=0, atol=0.02)


def group_samples():
    generator = torch.Generator().manual_seed(0)
    samples = []
    for prompt_len, responses in ((9, (5, 2, 7, 1)), (4, (6,))):
        prompt = torch.randint(10, 500, (prompt_len,), generator=generator).tolist()
        samples += [TrainSample(prompt + torch.randint(10, 500, (n,), generator=generator).tolist(), prompt_len,
                                [1] * n, [-1.0] * n, 1.0) for n in responses]
    return samples


def bf16_logprobs_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    prompts = PromptCache()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        carried = prompts.rows(model, batch.carried_prompts) if batch.carried_prompts else None
        logp, _ = token_logprobs(model, batch, carried=carried)
        (logp * batch.mask).sum().backward()
        prompts.backward(model)  # the prompts run again, with gradient
    return [(logp * batch.mask).detach(), *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("carry", [False, True], ids=["prompts-in-rows", "carried-prompts"])
def test_bf16_training_attends_by_matmuls_with_the_fused_kernels_numbers(monkeypatch, carry):
    torch.manual_seed(0)
    model, _ = build_tiny_random()
    model.train()
    batch = collate(group_samples(), carry_prompts=carry)
    calls = []
    matmuls = forward._bf16_cpu_attention
    monkeypatch.setattr(forward, "_bf16_cpu_attention", lambda *a: calls.append(a) or matmuls(*a))
    mine = bf16_logprobs_and_grads(model, batch)
    layers = model.config.num_hidden_layers
    # each layer: the first blocks, then the further samples' blocks; carried, each of the two prompts once more
    assert len(calls) == (4 if carry else 2) * layers

    def fused(query, key, value, mask, scale):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=mask is None, scale=scale,
                                              enable_gqa=True)
    monkeypatch.setattr(forward, "_bf16_cpu_attention", fused)
    theirs = bf16_logprobs_and_grads(model, batch)
    for got, want in zip(mine, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0.05 * float(want.abs().max()))


def test_without_autograd_or_in_fp32_the_fused_kernel_runs(monkeypatch):
    torch.manual_seed(0)
    model, _ = build_tiny_random()
    batch = collate(group_samples())
    monkeypatch.setattr(forward, "_bf16_cpu_attention", lambda *a: pytest.fail("the matmul attention ran"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        token_logprobs(model, batch)  # evaluation, the prompt cache's first run, old log-probs
    logp, _ = token_logprobs(model, batch)  # fp32 training
    logp.sum().backward()


def test_a_long_rows_attention_keeps_the_fused_kernels_memory(monkeypatch):
    """Above MATMUL_ATTENTION_MAX_SCORES the probabilities would cost more memory than flash's linear state."""
    torch.manual_seed(0)
    model, _ = build_tiny_random()
    model.train()
    batch = collate(group_samples())
    calls = []
    monkeypatch.setattr(forward, "_bf16_cpu_attention", lambda *a: calls.append(a))
    monkeypatch.setattr(forward, "MATMUL_ATTENTION_MAX_SCORES", 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = token_logprobs(model, batch)
    logp.sum().backward()
    assert calls == [] and torch.isfinite(logp).all()
