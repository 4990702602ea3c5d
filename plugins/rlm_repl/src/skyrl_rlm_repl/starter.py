"""The starter curriculum: short-context tasks that a 135M model solves now and then.

The built-in evidence task (papers, snippet F1) is out of reach of a small model at the start of
training, and a group of episodes that all score 0 gives GRPO no gradient. These tasks keep the real
mechanics (the model must write a ```repl block, run it on ``context`` in the sandbox and call
``FINAL``) but ask one-line questions about a short string, list or dict: from the first word (the
worked example's own question, so some answers are right from the first step) to the last word, a
sum or a dictionary lookup. Each row carries the one-line ``solution`` that answers it (the oracle plays it)
and is scored by exact match of the answer (up to case, spacing and punctuation).

Splits ``starter`` (240 rows) and ``starter_test`` (60 rows) are generated from fixed seeds, so every
machine sees the same tasks; their questions use the same templates with different contexts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STARTER_SPLITS = {"starter": (240, 0), "starter_test": (60, 1)}  # split -> (rows, seed)
WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "glass", "honey", "maple", "ocean",
         "pearl", "robot", "sugar", "tulip", "violet", "window", "yellow", "zebra", "candle", "forest", "garden")
LETTERS = "aeiorst"
ORDINALS = {1: "second", 2: "third"}


@dataclass(frozen=True)
class Kind:
    """One task template: how to draw a context, the question, and the solution line that answers it."""

    name: str
    make: Callable[[random.Random], tuple[Any, str, str]]  # rng -> (context, question, solution)


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.sample(WORDS, rng.randint(4, 7)))


def _numbers(rng: random.Random) -> list[int]:
    return rng.sample(range(1, 60), rng.randint(3, 6))


def _first_word(rng: random.Random) -> tuple[Any, str, str]:
    return _sentence(rng), "What is the first word of context?", "FINAL(context.split()[0])"


def _first_number(rng: random.Random) -> tuple[Any, str, str]:
    return _numbers(rng), "What is the first number in context?", "FINAL(context[0])"


def _last_word(rng: random.Random) -> tuple[Any, str, str]:
    return _sentence(rng), "What is the last word of context?", "FINAL(context.split()[-1])"


def _nth_word(rng: random.Random) -> tuple[Any, str, str]:
    index = rng.choice(list(ORDINALS))
    return _sentence(rng), f"What is the {ORDINALS[index]} word of context?", f"FINAL(context.split()[{index}])"


def _word_count(rng: random.Random) -> tuple[Any, str, str]:
    return _sentence(rng), "How many words are in context?", "FINAL(len(context.split()))"


def _letter_count(rng: random.Random) -> tuple[Any, str, str]:
    letter = rng.choice(LETTERS)
    return (_sentence(rng), f"How many times does the letter '{letter}' appear in context?",
            f"FINAL(context.count({letter!r}))")


def _reversed_words(rng: random.Random) -> tuple[Any, str, str]:
    return (_sentence(rng), "What are the words of context in reverse order?",
            "FINAL(' '.join(context.split()[::-1]))")


def _list_length(rng: random.Random) -> tuple[Any, str, str]:
    return _numbers(rng), "How many numbers are in context?", "FINAL(len(context))"


def _total(rng: random.Random) -> tuple[Any, str, str]:
    return _numbers(rng), "What is the sum of the numbers in context?", "FINAL(sum(context))"


def _largest(rng: random.Random) -> tuple[Any, str, str]:
    return _numbers(rng), "What is the largest number in context?", "FINAL(max(context))"


def _smallest(rng: random.Random) -> tuple[Any, str, str]:
    return _numbers(rng), "What is the smallest number in context?", "FINAL(min(context))"


def _lookup(rng: random.Random) -> tuple[Any, str, str]:
    keys = rng.sample(WORDS, rng.randint(3, 5))
    context = {key: rng.choice(WORDS) for key in keys}
    key = rng.choice(keys)
    return context, f"What is the value of the key '{key}' in context?", f"FINAL(context[{key!r}])"


KINDS = tuple(Kind(f.__name__.strip("_"), f) for f in (
    _first_word, _first_number, _last_word, _nth_word, _word_count, _letter_count, _reversed_words,
    _list_length, _total, _largest, _smallest, _lookup))


def solve(solution: str, context: Any) -> str:
    """The answer ``solution`` gives on ``context`` (trusted code of our own, never model output)."""
    answers: list[Any] = []
    exec(solution, {"context": context, "FINAL": answers.append})  # noqa: S102 - our fixed one-liners
    return str(answers[0])


def starter_tasks(split: str) -> list[dict[str, Any]]:
    """The rows of a starter split, the same on every machine (kinds in turn, contexts from a fixed seed)."""
    if split not in STARTER_SPLITS:
        raise ValueError(f"unknown starter split {split!r}; splits: {', '.join(STARTER_SPLITS)}")
    count, seed = STARTER_SPLITS[split]
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        context, question, solution = kind.make(rng)
        rows.append({"id": f"{split}-{index:03d}", "split": split, "kind": kind.name, "question": question,
                     "context": context, "answer": solve(solution, context), "solution": solution,
                     "prompt_style": "short"})
    return rows
