"""Token ids for chat messages, computed so multi-turn rollouts stay token-exact.

Observation tokens are the suffix that the chat template adds when observation messages follow an
assistant turn: render a fixed base conversation ending in an assistant message, render it again
with the observation appended, and keep only the new tokens. The generated ids are never
re-tokenised, so ``prompt_ids + response_ids`` equals a full re-render of the conversation whenever
the model's ids are the canonical tokenisation of its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Message = dict[str, str]
_CACHE_SIZE = 4096
_BASE: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the generator uses."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str: ...


def render_ids(tokenizer: ChatTokenizer, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
    """The chat template's token ids for ``messages`` (as ``apply_chat_template(tokenize=True)``).

    Renders the text and encodes it with the fast backend tokenizer directly when there is one,
    which skips most of the Python overhead of ``tokenizer(...)``.
    """
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=False).ids)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


class ChatRenderer:
    """Prompt and observation token ids for one tokenizer's chat template."""

    def __init__(self, tokenizer: ChatTokenizer, end_of_turn_id: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.base_ids = render_ids(tokenizer, _BASE, add_generation_prompt=False)
        eot = end_of_turn_id if end_of_turn_id is not None else tokenizer.eos_token_id
        if eot is None or eot not in self.base_ids:
            raise ValueError(
                "the chat template does not end assistant turns with the tokenizer's EOS token "
                f"(id {eot}); set generator.end_of_turn_token_id to the token that does")
        self.end_of_turn_id: int = eot
        last = len(self.base_ids) - 1 - self.base_ids[::-1].index(eot)
        # What the template puts after the end-of-turn token (ChatML: "\n"; Llama 3: nothing).
        self.turn_trailer = self.base_ids[last + 1:]
        # Observations repeat a lot (format errors, "ok"); rendering is the generator's main cost.
        self._suffix_cache: dict[tuple[tuple[str, str], ...], list[int]] = {}

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return render_ids(self.tokenizer, messages, add_generation_prompt=True)

    def observation_ids(self, observation: Sequence[Message], ended_with_end_of_turn: bool) -> list[int]:
        """Ids to append after a generated turn so the next generation starts a new assistant turn."""
        key = tuple((m["role"], m["content"]) for m in observation)
        suffix = self._suffix_cache.get(key)
        if suffix is None:
            suffix = self._observation_suffix(observation)
            if len(self._suffix_cache) >= _CACHE_SIZE:
                self._suffix_cache.pop(next(iter(self._suffix_cache)))
            self._suffix_cache[key] = suffix
        closing = [] if ended_with_end_of_turn else [self.end_of_turn_id]
        return closing + self.turn_trailer + suffix

    def _observation_suffix(self, observation: Sequence[Message]) -> list[int]:
        full = render_ids(self.tokenizer, [*_BASE, *observation], add_generation_prompt=True)
        if full[: len(self.base_ids)] != self.base_ids:
            raise ValueError("the chat template renders earlier turns differently once new messages follow; "
                             "token-in-token-out rollouts need a template that only appends")
        return full[len(self.base_ids):]
