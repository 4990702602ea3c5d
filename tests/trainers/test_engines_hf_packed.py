"""The ``hf`` engine's oneDNN-packed linear weights: same outputs as the plain model, never stale, never visible."""

from __future__ import annotations

import copy

import pytest
import torch
from skyrl_core.engine import EngineError, SamplingParams
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig, packing_available
from skyrl_trainers.precision import cpu_bf16_feature

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch has no oneDNN linear packing")

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def engine_on(tiny, **options) -> HFEngine:
    model, tokenizer = tiny
    return HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(**options))


def prompts(tokenizer, n=4):
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"count to {i} " * (i + 1)}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for i in range(n)]


def layer_forwards_installed(engine: HFEngine) -> int:
    return sum("forward" in layer.__dict__ for layer in engine.packed.layers)


async def test_packed_decoding_gives_the_plain_models_tokens_and_logprobs(tiny):
    packed, plain = engine_on(tiny, packed_dtype="float32"), engine_on(tiny, packed_weights=False)
    assert packed.packed.enabled and not plain.packed.enabled  # on by default for float32 CPU
    try:
        for prompt in prompts(tiny[1]):
            a, b = await packed.generate(prompt, GREEDY), await plain.generate(prompt, GREEDY)
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        assert packed.packed.weights is not None and plain.packed.weights is None
    finally:
        packed.close()
        plain.close()


@pytest.mark.skipif(not cpu_bf16_feature(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
async def test_bf16_packing_is_the_default_where_bf16_is_faster_and_keeps_the_head_in_float32(tiny, this_cpu):
    this_cpu(cpu_bf16_feature(), 2.0)  # real bf16 kernels; only the probe's verdict is given
    bf16, plain = engine_on(tiny), engine_on(tiny, packed_weights=False)
    try:
        prompt = prompts(tiny[1], 1)[0]
        a, b = await bf16.generate(prompt, GREEDY), await plain.generate(prompt, GREEDY)
        dtypes = [w.dtype for w in bf16.packed.weights]
        head = bf16.packed.layers.index(bf16.model.get_output_embeddings())
        assert dtypes[head] == torch.float32 and set(dtypes[:head] + dtypes[head + 1:]) == {torch.bfloat16}
        # bf16 rounding of the layers' weights and inputs only: the first token's logprob stays close
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(a.logprobs[0] - b.logprobs[0]) < 0.05
        assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # the model itself is unchanged
    finally:
        bf16.close()
        plain.close()


async def test_the_model_outside_decoding_is_the_plain_trainable_one(tiny):
    engine = engine_on(tiny)
    try:
        prompt = prompts(tiny[1], 1)[0]
        await engine.generate(prompt, GREEDY)
        assert engine.packed.weights is not None
        # the decode thread leaves its packing context just after delivering: wait for it to be idle
        await engine._batcher.run_exclusive(lambda: None)
        assert layer_forwards_installed(engine) == 0
        twin = copy.deepcopy(engine.model).train()  # e.g. a trainer's copy
        loss = twin(torch.tensor([prompt])).logits.logsumexp(-1).sum()
        loss.backward()
        assert all(p.grad is not None for p in twin.parameters() if p.requires_grad)
    finally:
        engine.close()


async def test_weights_changed_in_place_are_repacked_before_the_next_batch(tiny):
    engine = engine_on(tiny, packed_dtype="float32")  # exact packing: greedy tokens equal the plain model's
    try:
        prompt = prompts(tiny[1], 1)[0]
        before = await engine.generate(prompt, GREEDY)
        with torch.no_grad():  # what a colocated trainer's optimizer step does to shared weights
            engine.model.lm_head.weight[before.token_ids[0]] -= 50.0
        after = await engine.generate(prompt, GREEDY)
        assert after.token_ids[0] != before.token_ids[0]
        reference = engine_on((engine.model, tiny[1]), packed_weights=False)
        try:
            assert (await reference.generate(prompt, GREEDY)).token_ids == after.token_ids
        finally:
            reference.close()
    finally:
        engine.close()


async def test_updates_and_release_memory_free_the_packed_copy(tiny):
    engine = engine_on(tiny)
    try:
        prompt = prompts(tiny[1], 1)[0]
        await engine.generate(prompt, GREEDY)
        await engine.release_memory()
        assert engine.packed.weights is None
        await engine.generate(prompt, GREEDY)
        assert engine.packed.weights is not None
        await engine.update_weights({name: p.detach().clone() for name, p in engine.model.named_parameters()})
        assert engine.packed.weights is None and engine.weight_version == 1
    finally:
        engine.close()


def test_asking_for_packing_where_it_cannot_apply_is_a_clear_error(tiny):
    model, tokenizer = tiny
    with pytest.raises(EngineError, match="packed_weights=true needs a float32 model on CPU"):
        HFEngine.from_model(copy.deepcopy(model).to(torch.bfloat16), tokenizer, HFEngineConfig(packed_weights=True))
    engine = HFEngine.from_model(copy.deepcopy(model).to(torch.bfloat16), tokenizer, HFEngineConfig())
    assert not engine.packed.enabled  # auto: plain linear layers for bfloat16
    engine.close()
