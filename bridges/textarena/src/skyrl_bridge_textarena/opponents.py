"""Scripted opponents for the seat the policy does not play in a two-player TextArena game.

TextArena has no generic list of legal moves, so candidate moves are the bracketed moves the game itself shows
the opponent (``Available Moves: '[0]', '[1]'``, ``'[check]', '[bet]'``, the prompt's examples), most recent
first, plus a few per-game ones; a candidate counts as legal when the game accepts it on a copy of itself (the
copy's RNG draws are undone, so trying moves never changes the game).

- ``random``: a uniformly random legal candidate (seeded from the reset seed); ``opponent_move`` when none is.
- ``first_legal``: the first legal candidate in that order; ``opponent_move`` when none is.
- ``fixed``: ``opponent_move`` every turn, legal or not (TextArena's invalid-move rules then apply to it).
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from typing import Any

from skyrl_core.peer_rng import global_rng_kept

_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
# Bracketed text the games show that is never a move (role tags in messages, board decorations).
_NOT_MOVES = re.compile(r"^\[(GAME|Player \d+|X|O|\s*|[-=|+ ]+)\]$")


def _connect_four(game: Any) -> list[str]:
    return [f"[col {c}]" for c in range(getattr(game, "num_cols", 7))]


def _nim(game: Any) -> list[str]:
    piles = getattr(game.state, "game_state", {}).get("piles", [])
    return [f"[{i} {q}]" for i, size in enumerate(piles) for q in range(1, size + 1)]


EXTRA_CANDIDATES: dict[str, Callable[[Any], list[str]]] = {"ConnectFour": _connect_four, "Nim": _nim}


def candidates(game_name: str, game: Any, history: list[str]) -> list[str]:
    """Moves worth trying for the opponent: bracketed text it was shown (newest first), then per-game ones."""
    seen: dict[str, None] = {}
    for text in reversed(history):
        for match in _BRACKETED.findall(text):
            if not _NOT_MOVES.match(match):
                seen.setdefault(match, None)
    extra = EXTRA_CANDIDATES.get(game_name)
    if extra is not None:
        try:
            for move in extra(game):
                seen.setdefault(move, None)
        except Exception:  # noqa: BLE001 - a helper reading the game's internals is best effort
            pass
    return list(seen)


def is_legal(game: Any, move: str, player: int) -> bool:
    """Whether ``game`` accepts ``move`` from ``player``: tried on a deep copy, what that draws from the global
    RNGs undone (inside an episode's ``EpisodeRng.active()``, its states stay as they were)."""
    with global_rng_kept():
        try:
            trial = copy.deepcopy(game)
            trial.step(move)
        except Exception:  # noqa: BLE001 - a move that crashes the game is not one to play
            return False
        return not was_invalid(trial.state, player)


def was_invalid(state: Any, player: int) -> bool:
    """Whether ``player``'s move just played was invalid: TextArena's states clear ``made_invalid_move`` in their
    ``step`` but keep the error count above 0 after an invalid move (or mark the player when it ended the game)."""
    if getattr(state, "made_invalid_move", False):
        return True
    count = getattr(state, "error_count", 0)
    if isinstance(count, int) and count > 0:
        return True
    info = getattr(state, "game_info", {}) or {}
    return bool(info.get(player, {}).get("invalid_move", False))


class Opponent:
    """Chooses the scripted seat's move; ``rng`` is its own, seeded from the reset seed."""

    def __init__(self, kind: str, fallback: str, seed: int) -> None:
        self.kind = kind
        self.fallback = fallback
        self.rng = random.Random(seed)

    def choose(self, game_name: str, game: Any, player: int, history: list[str]) -> str:
        if self.kind == "fixed":
            return self.fallback
        moves = candidates(game_name, game, history)
        if self.kind == "random":
            self.rng.shuffle(moves)
        for move in moves:
            if is_legal(game, move, player):
                return move
        return self.fallback
