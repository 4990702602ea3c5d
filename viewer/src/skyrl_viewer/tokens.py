"""Token text for the token view, from the tokenizer of the run's model when one can be loaded offline.

samples.jsonl stores token ids, not their text. The viewer does not depend on transformers: it uses
``skyrl_trainers.models.load_tokenizer`` when skyrl-trainers is installed (it knows ``tiny-random`` and
the offline SmolLM2), else ``transformers.AutoTokenizer`` from the local cache only. Without either the
token view shows ids. Tokenizers are loaded once per model name; failures are remembered too.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

_cache: dict[str, Any] = {}
_lock = threading.Lock()


def _load(model: str) -> Any:
    try:
        try:
            from skyrl_trainers.models import load_tokenizer
        except ImportError:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(model, local_files_only=True)
        return load_tokenizer(model)
    except Exception as exc:  # any loader failure means "show ids": the viewer must not break on it
        log.warning("token view without text: no tokenizer for %r (%s)", model, exc)
        return None


def tokenizer_for(model: str | None) -> Any:
    """The tokenizer of ``model``, or ``None`` when it cannot be loaded here."""
    if not model:
        return None
    with _lock:
        if model not in _cache:
            _cache[model] = _load(model)
        return _cache[model]


def token_texts(model: str | None, ids: list[int]) -> list[str] | None:
    """The text of each token id (decoded one by one), or ``None`` without a tokenizer."""
    tokenizer = tokenizer_for(model)
    if tokenizer is None:
        return None
    try:
        return [tokenizer.decode([int(i)]) for i in ids]
    except Exception as exc:  # ids from another vocabulary, say: fall back to ids
        log.warning("token view without text: decoding failed (%s)", exc)
        return None
