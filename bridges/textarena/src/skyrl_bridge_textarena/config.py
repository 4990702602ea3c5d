"""Options of the ``textarena`` env id."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from skyrl_core.catalog import CatalogEnvConfig

DEFAULT_GAME = "GuessTheNumber-v0"
DEFAULT_MAX_TURNS = 64


class TextArenaEnvConfig(CatalogEnvConfig):
    """``env.name`` is a TextArena id (``skyrl envs --catalog textarena``), ``env.args`` its constructor kwargs
    (merged over the registry's, e.g. ``env.args.max_number=100``)."""

    name: str = Field(DEFAULT_GAME, min_length=1,
                      description="The TextArena game id, e.g. GuessTheNumber-v0, TicTacToe-v0 (-raw/-train "
                                  "variants are accepted and play the same game).")
    max_turns: int = Field(DEFAULT_MAX_TURNS, ge=1,
                           description="Policy turns for a game without its own turn limit; a game with one uses "
                                       "it (enough turns for TextArena's invalid-move allowance too) unless this is "
                                       "set explicitly and lower.")
    policy_seat: int = Field(0, ge=0, le=1, description="Two-player games: the seat the policy plays (0 or 1).")
    opponent: Literal["random", "first_legal", "fixed"] = Field(
        "random", description="Two-player games: the scripted other seat. random: a seeded random move the game "
                              "accepts; first_legal: the first move the game accepts; fixed: opponent_move every "
                              "turn (see the README).")
    opponent_move: str = Field("[0]", min_length=1,
                               description="The fixed opponent's move, and the fallback of the others when no "
                                           "candidate move is legal.")

    @field_validator("name")
    @classmethod
    def _known_game(cls, name: str) -> str:
        """An unknown id is an error where the config is read, not in every episode of a run."""
        from .env import lookup

        lookup(name)
        return name
