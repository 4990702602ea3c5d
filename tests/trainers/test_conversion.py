"""The converted ``smollm2-135m`` folder is exactly what the packaged GGUF declares.

Checked independently of transformers' GGUF loader, with the ``gguf`` package's own reader and
dequantiser: every tensor (llama.cpp's row permutation of ``attn_q``/``attn_k`` undone here), the
tokenizer's vocabulary, merges, special ids, pre-tokenisation and chat template, and the config.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from skyrl_trainers import models

pytest.importorskip("gguf")
pytest.importorskip("safetensors")
jinja2 = pytest.importorskip("jinja2")

# GGUF (llama architecture) tensor name -> Hugging Face Llama parameter name.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}

# llama.cpp's "smollm" pre-tokenizer: single digits first, then the GPT-2 split.
_SMOLLM_PRE_SPLITS = (r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")

SAMPLE_TEXTS = (
    "The capital of France is Paris.",
    "In 2024, 1,234 people paid $56.78 each; that's 3x more than in '99!",
    "  Leading spaces,\ttabs\nand new lines\n\n  stay put. Don't they?",
    "naïve café — Zürich 東京 émigré x² ½",
    "def f(x):\n    return x**2 + 10  # comment",
)


def _gguf_path() -> Path:
    try:
        return models.smollm2_gguf_path()
    except models.ModelLoadError as exc:
        pytest.skip(f"the GGUF package is not installed ({exc}); CI installs it")


@pytest.fixture(scope="module")
def gguf_reader():
    from gguf import GGUFReader

    return GGUFReader(_gguf_path())


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The folder that ``load_model_and_tokenizer("smollm2-135m")`` uses when there is no hub copy.

    Reuses the user's conversion cache when it is complete (that is what rollouts load), so a stale
    cache that no longer matches the GGUF fails here too.
    """
    _gguf_path()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(models, "_in_hf_cache", lambda hub_id: False)
        return Path(models.model_source(models.SMOLLM2))


def _field(reader, key):
    field = reader.fields.get(key)
    assert field is not None, f"GGUF has no {key!r}"
    return field.contents()


def _unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` (convert_hf_to_gguf.py) of q/k projection rows."""
    return (weight.reshape(n_head, weight.shape[0] // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _hf_name(gguf_name: str) -> str:
    block = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
    if block:
        return f"model.layers.{block[1]}.{_BLOCK_NAMES[block[2]]}.weight"
    return _TOP_NAMES[gguf_name]


def test_every_tensor_equals_the_dequantised_gguf(gguf_reader, converted):
    from gguf.quants import dequantize
    from safetensors import safe_open

    n_head = int(_field(gguf_reader, "llama.attention.head_count"))
    n_head_kv = int(_field(gguf_reader, "llama.attention.head_count_kv"))
    with safe_open(str(converted / "model.safetensors"), framework="np") as stored:
        remaining = set(stored.keys())
        for tensor in gguf_reader.tensors:
            expected = dequantize(tensor.data, tensor.tensor_type)
            expected = expected.reshape([int(n) for n in reversed(tensor.shape)]).astype(np.float32)
            kind = tensor.name.split(".")[-2]
            if kind == "attn_q":
                expected = _unpermute(expected, n_head)
            elif kind == "attn_k":
                expected = _unpermute(expected, n_head_kv)
            name = _hf_name(tensor.name)
            assert name in remaining, f"{tensor.name} -> {name} missing from the converted folder"
            remaining.discard(name)
            actual = stored.get_tensor(name)
            assert actual.dtype == np.float32 and actual.shape == expected.shape, name
            np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7, err_msg=f"{tensor.name} -> {name}")
    # Nothing extra (the output head is tied to the embedding, which the GGUF also has no copy of).
    assert remaining == set()
    assert not any(t.name == "output.weight" for t in gguf_reader.tensors)


def test_config_matches_gguf_metadata(gguf_reader, converted):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(converted)
    meta = {key: _field(gguf_reader, f"llama.{key}") for key in (
        "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.dimension_count",
        "vocab_size")}
    assert config.model_type == "llama"
    assert config.num_hidden_layers == meta["block_count"]
    assert config.max_position_embeddings == meta["context_length"]
    assert config.hidden_size == meta["embedding_length"]
    assert config.intermediate_size == meta["feed_forward_length"]
    assert config.num_attention_heads == meta["attention.head_count"]
    assert config.num_key_value_heads == meta["attention.head_count_kv"]
    assert config.head_dim == meta["rope.dimension_count"] == config.hidden_size // config.num_attention_heads
    assert config.vocab_size == meta["vocab_size"]
    # transformers >= 5 keeps rope settings in ``rope_parameters`` (``rope_scaling`` is an alias of it).
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    assert rope.get("rope_type", rope.get("type", "default")) == "default"  # the GGUF declares no rope scaling
    assert rope_theta == pytest.approx(meta["rope.freq_base"], rel=1e-7)
    assert config.rms_norm_eps == pytest.approx(meta["attention.layer_norm_rms_epsilon"], rel=1e-6)
    assert config.hidden_act == "silu" and not config.attention_bias and not config.mlp_bias
    # No output.weight in the GGUF means llama.cpp ties the head to token_embd.
    assert config.tie_word_embeddings is True
    assert config.bos_token_id == _field(gguf_reader, "tokenizer.ggml.bos_token_id")
    assert config.eos_token_id == _field(gguf_reader, "tokenizer.ggml.eos_token_id")


def test_tokenizer_vocabulary_merges_and_special_ids(gguf_reader, converted):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    tokens = _field(gguf_reader, "tokenizer.ggml.tokens")
    types = _field(gguf_reader, "tokenizer.ggml.token_type")
    assert _field(gguf_reader, "tokenizer.ggml.model") == "gpt2"
    vocab = tokenizer.get_vocab()
    assert len(vocab) == len(tokenizer) == len(tokens)
    assert vocab == {token: index for index, token in enumerate(tokens)}
    model = tokenizer.backend_tokenizer.model
    bpe = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in bpe["merges"]]
    assert type(model).__name__ == "BPE" and merges == list(_field(gguf_reader, "tokenizer.ggml.merges"))
    # Control tokens (type 3) are special, and only they are.
    control = {tokens[i] for i, t in enumerate(types) if t == 3}
    assert set(tokenizer.all_special_tokens) <= control
    added = {t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values() if t.special}
    assert added == control
    assert tokenizer.bos_token_id == _field(gguf_reader, "tokenizer.ggml.bos_token_id")
    assert tokenizer.eos_token_id == _field(gguf_reader, "tokenizer.ggml.eos_token_id")
    assert tokenizer.pad_token_id == _field(gguf_reader, "tokenizer.ggml.padding_token_id")
    assert tokenizer.unk_token_id == _field(gguf_reader, "tokenizer.ggml.unknown_token_id")
    # The GGUF adds no BOS; neither does the tokenizer.
    assert _field(gguf_reader, "tokenizer.ggml.add_bos_token") is False
    assert tokenizer("hello")["input_ids"] == tokenizer("hello", add_special_tokens=False)["input_ids"]


def test_tokenisation_matches_a_reference_bpe(gguf_reader, converted):
    """Byte-level BPE with the GGUF's merges and llama.cpp's ``smollm`` pre-tokenizer, written out here."""
    regex = pytest.importorskip("regex")
    from transformers import AutoTokenizer

    assert _field(gguf_reader, "tokenizer.ggml.pre") == "smollm"
    tokens = _field(gguf_reader, "tokenizer.ggml.tokens")
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(_field(gguf_reader, "tokenizer.ggml.merges"))}
    ids = {token: index for index, token in enumerate(tokens)}
    byte_chars = _bytes_to_unicode()

    @cache
    def bpe(word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((ranks.get((a, b), len(ranks)), i) for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False)))
            if rank == len(ranks):
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return tuple(parts)

    def reference(text: str) -> list[int]:
        pieces = [text]
        for pattern in _SMOLLM_PRE_SPLITS:
            pieces = [p for piece in pieces for p in _split_keep(regex, pattern, piece)]
        return [ids[t] for piece in pieces for t in bpe("".join(byte_chars[b] for b in piece.encode()))]

    tokenizer = AutoTokenizer.from_pretrained(converted)
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == reference(text), text
        assert tokenizer.decode(reference(text)) == text


def test_chat_template_matches_gguf(gguf_reader, converted):
    from transformers import AutoTokenizer

    template = _field(gguf_reader, "tokenizer.chat_template")
    tokenizer = models.load_tokenizer(str(converted))
    assert AutoTokenizer.from_pretrained(converted).chat_template == template
    assert tokenizer.chat_template == template
    # The rollout EOS is the template's end-of-turn token, which is also the GGUF's EOS.
    assert tokenizer.eos_token == "<|im_end|>" == _field(gguf_reader, "tokenizer.ggml.tokens")[tokenizer.eos_token_id]
    env = jinja2.Environment()
    conversations = (
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    )
    for messages in conversations:
        for add_generation_prompt in (True, False):
            expected = env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)
            rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt)
            assert rendered == expected
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert list(ids) == tokenizer.encode(expected, add_special_tokens=False)
    assert "<|im_start|>" in expected and expected.count("<|im_end|>") == 4


def _split_keep(regex, pattern: str, text: str) -> list[str]:
    """Split ``text`` into the matches of ``pattern`` and the stretches between them (llama.cpp style)."""
    out, last = [], 0
    for match in regex.finditer(pattern, text):
        if match.start() > last:
            out.append(text[last:match.start()])
        out.append(match.group())
        last = match.end()
    if last < len(text):
        out.append(text[last:])
    return [piece for piece in out if piece]


def _bytes_to_unicode() -> dict[int, str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
