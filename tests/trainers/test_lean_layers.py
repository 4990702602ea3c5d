"""Lean MLPs and RMSNorms: the same outputs and gradients as transformers' own, with fewer saved activations."""

import copy

import pytest
import torch
from skyrl_trainers.lean_layers import install_lean_layers
from skyrl_trainers.models import build_tiny_random
from torch.autograd.graph import saved_tensors_hooks


def tiny_llama():
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         initializer_range=0.2, mlp_bias=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


MODELS = {"llama (mlp bias)": tiny_llama, "qwen2 (tiny-random)": lambda: build_tiny_random()[0]}


def input_ids():
    return torch.randint(3, 290, (2, 11), generator=torch.Generator().manual_seed(0))


def logits_and_grads(model, bf16=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids()).logits.float()
    weights = torch.linspace(-1, 1, logits.numel()).view_as(logits)
    (logits.log_softmax(-1) * weights).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_close_to_scale(actual, expected, tolerance, name):
    """Equal up to float summation order: within ``tolerance`` of the tensor's largest entry."""
    error = (actual - expected).abs().max().item()
    assert error <= tolerance * expected.abs().max().item(), (name, error)


def plain_and_lean(build):
    plain = build()
    lean = copy.deepcopy(plain)
    layers = plain.config.num_hidden_layers
    assert install_lean_layers(lean) == layers + 2 * layers + 1  # MLPs, two norms a layer, the final norm
    return plain.train(), lean.train()


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_float32_outputs_and_every_gradient_equal_the_plain_model(build):
    plain, lean = plain_and_lean(build)
    logits, grads = logits_and_grads(plain)
    lean_logits, lean_grads = logits_and_grads(lean)
    assert torch.equal(lean_logits, logits)  # the forward runs the same operations
    assert lean_grads.keys() == grads.keys() and any("down_proj.bias" in name for name in grads) == (
        plain.config.model_type == "llama")
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        assert_close_to_scale(lean_grads[name], grad, 1e-5, name)


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_bf16_autocast_matches_the_plain_model_and_keeps_float32_gradients(build):
    plain, lean = plain_and_lean(build)
    logits, grads = logits_and_grads(plain, bf16=True)
    lean_logits, lean_grads = logits_and_grads(lean, bf16=True)
    assert torch.equal(lean_logits, logits)
    for name, grad in grads.items():
        assert lean_grads[name].dtype == torch.float32, name
        # both run their matmuls in bf16; only the order of float32 sums differs
        assert_close_to_scale(lean_grads[name], grad, 2e-2, name)


def saved_bytes(model):
    """Bytes autograd keeps for backward after one forward, each storage counted once."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(input_ids())
    return sum(storages.values())


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_saved_activations_shrink_by_two_mlp_tensors_a_layer_and_one_per_norm(build):
    plain, lean = plain_and_lean(build)
    config = plain.config
    tokens, layers = input_ids().numel(), config.num_hidden_layers
    floats = 2 * config.intermediate_size * layers + config.hidden_size * (2 * layers + 1)
    assert saved_bytes(plain) - saved_bytes(lean) == floats * tokens * 4


def test_without_gradient_the_modules_own_forward_runs():
    """An engine decoding with the trained module (packed weights swap the linears' forwards) is untouched."""
    _, lean = plain_and_lean(tiny_llama)
    calls = []
    lean.model.layers[0].mlp.down_proj.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        lean(input_ids())
    assert calls == [1]
    output = lean.model.layers[0].mlp(torch.randn(2, 48, requires_grad=True))
    assert type(output.grad_fn).__name__ == "_SiluGatedDownBackward" and calls == [1]


def test_a_lora_adapter_on_down_proj_runs_the_plain_mlp_and_trains_the_adapter():
    from peft import LoraConfig, get_peft_model

    plain, lean = plain_and_lean(tiny_llama)
    adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj"], init_lora_weights=False)
    torch.manual_seed(5)
    plain = get_peft_model(plain, adapters)
    torch.manual_seed(5)  # the same adapter weights
    lean = get_peft_model(lean, adapters)
    logits, grads = logits_and_grads(plain)
    lean_logits, lean_grads = logits_and_grads(lean)
    assert torch.equal(lean_logits, logits)
    lora = [name for name in grads if "lora_B" in name]
    assert lora and lean_grads.keys() == grads.keys()
    for name in lora:
        assert_close_to_scale(lean_grads[name], grads[name], 1e-5, name)


def test_other_architectures_are_left_alone():
    from transformers import AutoModelForCausalLM, GPT2Config

    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    assert install_lean_layers(model) == 0
