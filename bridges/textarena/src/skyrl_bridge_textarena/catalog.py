"""``skyrl envs --catalog textarena``: every TextArena game, tagged with what the bridge can do with it."""

from __future__ import annotations

from skyrl_core.catalog import CatalogEntry

from . import games
from .gold import GOLD


def entry(env_id: str) -> CatalogEntry:
    info = games.game_info(env_id)
    tags = [{"single": "single-player", "two": "two-player", "multi": "multi-player"}[info.players]]
    tags += [f"needs nltk:{name}" for name in info.nltk]
    if info.network:
        tags.append("needs network")
    tags += [f"needs python:{name}" for name in info.missing_modules]
    if info.syntax_error:
        tags.append("needs newer python")
    if info.game in games.BROKEN_PACKAGING:
        tags.append("peer-packaging-bug")
    if not info.supported:
        tags.append("unsupported")
    if info.players == "single" and info.game in GOLD:
        tags.append("gold")
    if info.game in games.PEER_BUGS:
        tags.append("peer-bug")
    description = f"TextArena {info.game} ({info.entry_point.split(':')[1]})"
    if info.kwargs:
        description += " " + ", ".join(f"{k}={v!r}" for k, v in sorted(info.kwargs.items()))[:160]
    if info.unsupported_reason:
        description += f"; unsupported: {info.unsupported_reason}"
    if info.game in games.PEER_BUGS:
        description += f"; peer bug: {games.PEER_BUGS[info.game]}"
    # max_turns stays None: a game's limit in policy turns is known after reset (TextArenaEnv.max_turns).
    return CatalogEntry(name=env_id, description=description, multi_turn=True, reward_range=info.reward_range(),
                        tags=tuple(tags))


def entries() -> list[CatalogEntry]:
    """One entry per plain TextArena id (the -raw/-train variants play the same game and are accepted as names)."""
    return [entry(env_id) for env_id in games.catalogue_ids()]
