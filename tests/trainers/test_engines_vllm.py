"""The ``vllm`` engine: clear errors where vLLM or a GPU is missing; real generation and weight sync on GPU."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch
from skyrl_core.engine import SamplingParams
from skyrl_trainers.engines.vllm import (
    VLLMEngine,
    VLLMEngineConfig,
    VLLMUnavailableError,
    check_vllm_available,
    chunk_named_tensors,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(HAS_VLLM and HAS_CUDA, reason="vLLM and a GPU are both present")
def test_missing_vllm_or_gpu_is_named_with_the_alternative():
    with pytest.raises(VLLMUnavailableError) as err:
        VLLMEngine(VLLMEngineConfig(model="tiny-random"))
    message = str(err.value)
    if not HAS_VLLM:
        assert "vllm package is not installed" in message and "skyrl-trainers[vllm]" in message
    if not HAS_CUDA:
        assert "no CUDA GPU" in message
    assert "override engine.id=hf" in message and "--engine hf" in message


def test_config_rejects_unknown_keys_and_bad_memory_fraction():
    with pytest.raises(ValueError, match="gpu_memory_utilisation"):
        VLLMEngineConfig(gpu_memory_utilisation=0.5)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMEngineConfig(gpu_memory_utilization=1.5)


def test_weight_chunks_respect_the_byte_budget_and_keep_order():
    tensors = [(f"w{i}", torch.full((256,), float(i))) for i in range(5)]  # 1 KiB each in float32
    chunks = list(chunk_named_tensors(tensors, max_bytes=2048))
    assert [[name for name, _ in c] for c in chunks] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert all(t.device.type == "cpu" and t.is_contiguous() for c in chunks for _, t in c)
    big = list(chunk_named_tensors({"big": torch.zeros(1024), "small": torch.zeros(1)}, max_bytes=100))
    assert [[n for n, _ in c] for c in big] == [["big"], ["small"]]


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and HAS_CUDA), reason="needs vLLM and a CUDA GPU")
def test_vllm_generates_and_follows_weight_updates():
    from skyrl_trainers.models import load_model_and_tokenizer

    check_vllm_available()
    engine = VLLMEngine(VLLMEngineConfig(model="tiny-random", gpu_memory_utilization=0.2, enforce_eager=True,
                                         max_model_len=512))
    try:
        tokenizer = engine.tokenizer
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "reverse apple"}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
        greedy = SamplingParams(max_tokens=8, temperature=0)
        outs = asyncio.run(_gather(engine, [prompt] * 4, greedy))
        assert all(o.token_ids == outs[0].token_ids and len(o.token_ids) == len(o.logprobs) for o in outs)
        # Zeroing the output embedding makes every next token equally likely: logprob = -log(vocab).
        model, _ = load_model_and_tokenizer("tiny-random")
        state = {k: (torch.zeros_like(v) if k == "model.embed_tokens.weight" else v)
                 for k, v in model.state_dict().items()}
        asyncio.run(engine.update_weights(state))
        after = asyncio.run(engine.generate(prompt, greedy))
        assert after.metadata["weight_version"] == 1
        assert after.logprobs[0] == pytest.approx(-float(torch.log(torch.tensor(model.config.vocab_size))), abs=1e-2)
    finally:
        engine.close()


async def _gather(engine, prompts, params):
    return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
