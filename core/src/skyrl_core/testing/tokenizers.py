"""Real, small Hugging Face tokenizers with real chat templates, built locally in about a second.

Nothing is downloaded: a byte-level BPE is trained on a built-in corpus and wrapped in
``PreTrainedTokenizerFast`` with one of two common chat-template styles:

* ``chatml`` (Qwen2/SmolLM): ``<|im_start|>role\\ncontent<|im_end|>\\n``
* ``llama3``: ``<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>``

Needs ``transformers`` and ``tokenizers`` (``pip install 'skyrl-core[test]'``).
"""

from __future__ import annotations

import string
from functools import cache
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
STYLES = {
    "chatml": (CHATML_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", "<|endoftext|>"),
    "llama3": (LLAMA3_TEMPLATE, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                 "<|end_of_text|>"], "<|eot_id|>", "<|end_of_text|>"),
}
_CORPUS = """\
The quick brown fox jumps over the lazy dog. Reverse the text and answer in tags.
You are a helpful assistant. Write code in ```repl blocks and call FINAL(answer) when done.
SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY name ORDER BY 2 DESC LIMIT 10;
def solve(x): return [i * 2 for i in range(x) if i % 3 == 0]  # comment
import re, json, math; print(json.dumps({"answer": 42, "ok": True}))
<answer>olleh</answer> <sql>SELECT 1</sql> <solution>SELECT * FROM t</solution> <search>q</search>
Observation: Error: no such table. Correct! Wrong answer, try again. Reward 1.0 0.5 0
"""


@cache
def _build(style: str, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if style not in STYLES:
        raise ValueError(f"unknown chat template style {style!r}; choose from {sorted(STYLES)}")
    template, specials, eos, pad = STYLES[style]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [_CORPUS, string.printable] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad)
    fast.chat_template = template
    return fast


def make_tokenizer(style: str = "chatml", vocab_size: int = 512) -> Any:
    """A fresh copy of a small real tokenizer with the given chat-template style."""
    import copy

    return copy.deepcopy(_build(style, vocab_size))
