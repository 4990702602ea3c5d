"""Calling into TextArena safely: its global RNG isolated, ``nltk.download`` disarmed, missing data named.

TextArena draws from the process-wide ``random`` module (``State.__init__`` calls ``random.seed``) and some
games from ``numpy.random``; several game modules call ``nltk.download`` when imported or constructed. Every
call into the peer runs inside :func:`episode` (the episode's own global RNG states installed by
:class:`skyrl_core.peer_rng.EpisodeRng`, under core's process-wide peer lock) or :func:`import_textarena`
(the process's states kept), with ``nltk.download`` replaced by a guard that never touches the network.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from skyrl_core.peer_rng import EpisodeRng, global_rng_kept

NLTK_CATEGORIES = ("corpora", "taggers", "tokenizers", "chunkers", "models", "grammars", "help", "misc",
                   "sentiment", "stemmers")


class MissingPeerData(RuntimeError):
    """A TextArena game needs data (an nltk corpus) that is not installed; nothing is downloaded."""


def missing_nltk(resources: tuple[str, ...] | list[str]) -> list[str]:
    """The nltk resources of ``resources`` that no directory of ``nltk.data.path`` holds."""
    if not resources:
        return []
    import nltk

    missing = []
    for name in resources:
        for category in NLTK_CATEGORIES:
            try:
                nltk.data.find(f"{category}/{name}")
                break
            except LookupError:
                continue
        else:
            missing.append(name)
    return missing


def missing_data_message(game: str, missing: list[str]) -> str:
    names = " ".join(missing)
    return (f"TextArena game {game!r} needs the nltk data {', '.join(missing)}, which is not installed, and this "
            f"bridge never downloads at run time. Install it on a machine with network access with "
            f"`python -m nltk.downloader {names}` (into a directory on nltk's search path, e.g. ~/nltk_data) or copy "
            f"it there and point the NLTK_DATA environment variable at it.")


def _download_guard(info: Any = None, *args: Any, **kwargs: Any) -> bool:
    """Replaces ``nltk.download`` during peer calls: a resource already installed is fine, a missing one raises."""
    names = [info] if isinstance(info, str) else list(info or [])
    missing = missing_nltk([n for n in names if isinstance(n, str)])
    if missing:
        raise MissingPeerData(missing_data_message("(a TextArena game)", missing))
    return True


@contextmanager
def _nltk_disarmed() -> Iterator[None]:
    """``nltk.download`` replaced by :func:`_download_guard` (enter under the peer lock: it patches a module)."""
    try:
        import nltk
    except ImportError:  # pragma: no cover - textarena depends on nltk
        yield
        return
    saved = nltk.download
    nltk.download = _download_guard
    try:
        yield
    finally:
        nltk.download = saved


def import_textarena() -> Any:
    """``textarena``, imported with ``nltk.download`` disarmed and the process's RNG states kept."""
    with global_rng_kept(), _nltk_disarmed():
        return importlib.import_module("textarena")


@contextmanager
def episode(rng: EpisodeRng) -> Iterator[None]:
    """Peer calls of one episode: ``rng``'s global states active, ``nltk.download`` disarmed. Inside it,
    ``skyrl_core.peer_rng.global_rng_kept()`` undoes what a trial (a move tried on a copy) draws."""
    with rng.active(), _nltk_disarmed():
        yield


def make_game(entry_point: str, kwargs: dict[str, Any], game_id: str, nltk_needed: tuple[str, ...]) -> Any:
    """A new unwrapped TextArena game object (call inside :func:`episode`).

    A game whose nltk data is missing raises :class:`MissingPeerData` naming it, before its module is imported.
    """
    missing = missing_nltk(nltk_needed)
    if missing:
        raise MissingPeerData(missing_data_message(game_id, missing))
    import_textarena()
    module_name, class_name = entry_point.split(":")
    module = importlib.import_module(module_name)
    game = getattr(module, class_name)(**kwargs)
    game.env_id = game_id
    return game

