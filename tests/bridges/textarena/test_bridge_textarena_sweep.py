"""Every single-player TextArena game: make + reset + one move, or one clear reason why it cannot run here."""

from __future__ import annotations

import random
import time

import pytest

pytest.importorskip("textarena")

from skyrl_bridge_textarena import games  # noqa: E402
from skyrl_bridge_textarena.env import TextArenaEnv  # noqa: E402
from skyrl_bridge_textarena.peer import MissingPeerData, missing_nltk  # noqa: E402

# Puzzle generation past ~20 s at this seed (Sokoban's room search, Sudoku's unique-solution removal).
SLOW = {"Sokoban-v0-medium", "Sudoku-v0-hard"}
SINGLE = [gid for gid in games.catalogue_ids() if games.game_info(gid).players == "single"]
BUDGET_S = 30.0


def _outcome(gid: str) -> str:
    """"ok", "gold" (ok and has gold moves), "missing-data" or "unsupported"."""
    info = games.game_info(gid)
    env = TextArenaEnv(config={"name": gid})
    if info.unsupported_reason:
        with pytest.raises(ValueError, match="not supported by this bridge"):
            env.reset(seed=5)
        return "unsupported"
    if missing_nltk(info.nltk):
        with pytest.raises(MissingPeerData, match="nltk.downloader"):
            env.reset(seed=5)
        return "missing-data"
    obs, info_ = env.reset(seed=5)
    assert obs and obs[0]["content"] and info_["max_turns"] >= 1
    result = env.step(env.null_action())
    assert not result.info.get("error"), result.info
    low, high = env.reward_range
    assert low <= result.reward <= high
    return "gold" if env.gold_actions() else "ok"


@pytest.mark.parametrize("gid", [pytest.param(g, marks=pytest.mark.slow) if g in SLOW else g for g in SINGLE])
def test_single_player_game_makes_resets_and_moves(gid):
    state = random.getstate()
    start = time.monotonic()
    _outcome(gid)
    assert gid in SLOW or time.monotonic() - start < BUDGET_S
    assert random.getstate() == state


def test_single_player_counts():
    """The counts the README states (textarena 0.7.4, Python 3.11, no nltk data installed)."""
    counts: dict[str, int] = {}
    for gid in SINGLE:
        info = games.game_info(gid)
        kind = ("unsupported" if info.unsupported_reason else "missing-data" if missing_nltk(info.nltk)
                else "runs")
        counts[kind] = counts.get(kind, 0) + 1
    assert len(SINGLE) == 74
    assert counts["unsupported"] == 6  # BabyAiText (babyai/gym), GuessWho + TwentyQuestions x2 (network), Klondike + UltimateTexasHoldem (3.12 syntax)
    if not missing_nltk(["words", "averaged_perceptron_tagger_eng"]):
        pytest.skip("nltk data installed: the missing-data count does not apply")
    assert counts == {"runs": 57, "missing-data": 11, "unsupported": 6}
