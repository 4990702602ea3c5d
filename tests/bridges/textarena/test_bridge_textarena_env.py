"""The textarena bridge: catalogue, conformance, invalid moves, RNG isolation, missing data, two-player play."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("textarena")

from skyrl_bridge_textarena.env import TextArenaEnv  # noqa: E402
from skyrl_bridge_textarena.peer import MissingPeerData, missing_nltk  # noqa: E402
from skyrl_core.catalog import catalog_entries  # noqa: E402
from skyrl_core.testing import check_adversarial, check_env  # noqa: E402

GOLD_GAMES = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Mastermind-v0", "Secretary-v0", "FrozenLake-v0",
              "ThreeCardMonte-v0", "Sudoku-v0-very-easy"]


def play(env: TextArenaEnv, actions: list[str]) -> tuple[float, list]:
    total, results = 0.0, []
    for action in actions:
        result = env.step(action)
        total += result.reward
        results.append(result)
        if result.terminated or result.truncated:
            break
    return total, results


def test_catalogue_lists_textarena_games_with_seats_data_and_gold_tags():
    entries = {entry.name: entry for entry in catalog_entries("textarena")}
    assert len(entries) > 200 and not any(name.endswith(("-raw", "-train")) for name in entries)
    assert {"single-player", "gold"} <= set(entries["GuessTheNumber-v0"].tags)
    assert entries["GuessTheNumber-v0"].reward_range == (0.0, 1.0)
    assert "two-player" in entries["TicTacToe-v0"].tags and entries["TicTacToe-v0"].reward_range == (-1.0, 1.0)
    assert "needs nltk:words" in entries["Hangman-v0"].tags
    assert {"multi-player", "unsupported"} <= set(entries["Codenames-v0"].tags)
    assert {"needs network", "unsupported"} <= set(entries["TwentyQuestions-v0"].tags)
    assert "peer-bug" in entries["Bandit-v0"].tags


@pytest.mark.parametrize("name", [*GOLD_GAMES, "TicTacToe-v0", "2048-v0", "Minesweeper-v0"])
def test_check_env_passes(name):
    report = check_env("textarena", config={"name": name}, n_tasks=2)
    gold_checks = [check for check in report.passed if check.startswith("gold")]
    assert len(gold_checks) == (2 if name in GOLD_GAMES else 0), report.skipped


def test_variant_names_play_the_same_game():
    plain, raw = TextArenaEnv(config={"name": "GuessTheNumber-v0"}), TextArenaEnv(config={"name": "GuessTheNumber-v0-raw"})
    assert plain.reset(seed=4)[0] == raw.reset(seed=4)[0] and plain.gold_actions() == raw.gold_actions()


def test_unknown_game_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown TextArena game 'GuessTheNumbr-v0'.*GuessTheNumber-v0"):
        TextArenaEnv(config={"name": "GuessTheNumbr-v0"})


def test_turn_limits_follow_the_game():
    env = TextArenaEnv(config={"name": "GuessTheNumber-v0"})  # 10 guesses, one invalid allowed before each
    env.reset(seed=0)
    assert env.max_turns == 20
    env = TextArenaEnv(config={"name": "GuessTheNumber-v0", "max_turns": 5})
    env.reset(seed=0)
    assert env.max_turns == 5
    env = TextArenaEnv(config={"name": "TicTacToe-v0"})  # no limit of its own
    env.reset(seed=0)
    assert env.max_turns == 64


def test_reward_is_paid_once_at_the_end_from_textarena():
    env = TextArenaEnv(config={"name": "TowerOfHanoi-v0"})
    env.reset(seed=1)
    total, results = play(env, env.gold_actions())
    assert [r.reward for r in results[:-1]] == [0.0] * (len(results) - 1)
    assert total == 1.0 and results[-1].terminated and results[-1].info["peer_rewards"] == {0: 1}


def test_rejected_replies_reach_textarenas_invalid_move_rules():
    env = TextArenaEnv(config={"name": "GuessTheNumber-v0"})
    env.reset(seed=2)
    first = env.step("")  # TextArena allows one invalid move, then ends the game
    assert not first.terminated and first.info["invalid_move"] and "rejected" in first.info
    assert "invalid move" in first.observation[0]["content"]
    second = env.step("x" * (env.config.max_action_chars + 1))
    assert second.terminated and second.info["reason"].startswith("Invalid Move")
    assert second.reward == 0.0  # GuessTheNumber pays its progress (no guess yet) on an invalid end

    env = TextArenaEnv(config={"name": "TicTacToe-v0"})
    env.reset(seed=2)
    total, results = play(env, ["", " \n "])
    assert results[-1].terminated and total == -1.0 and results[-1].info["peer_rewards"] == {0: -1, 1: 1}


def test_same_seed_same_game_and_the_process_rng_is_untouched():
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()[1].copy()
    secrets = []
    for seed in (7, 7, 8):
        env = TextArenaEnv(config={"name": "Mastermind-v0"})
        env.reset(seed=seed)
        secrets.append(env.gold_actions())
        play(env, ["[1 2 3 4]", "[2 3 4 5]", "I do not know.", "I do not know."])
    assert secrets[0] == secrets[1] != secrets[2]
    assert random.getstate() == py_state and (np.random.get_state()[1] == np_state).all()
    # and the global state does not leak into the game: the same seed after other draws gives the same game
    random.random()
    env = TextArenaEnv(config={"name": "Mastermind-v0"})
    env.reset(seed=7)
    assert env.gold_actions() == secrets[0]


def test_dataset_rows_are_distinct_deals():
    rows = TextArenaEnv.load_dataset("train", TextArenaEnv.config_class(name="GuessTheNumber-v0"))
    golds = set()
    for row in rows[:8]:
        env = TextArenaEnv(task=row, config={"name": "GuessTheNumber-v0"})
        env.reset(seed=0)
        golds.add(env.gold_actions()[0])
    assert len(golds) > 3


@pytest.mark.skipif(not missing_nltk(["words"]), reason="nltk's words corpus is installed here")
def test_missing_nltk_data_fails_at_reset_without_downloading(monkeypatch):
    import nltk

    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a))
    env = TextArenaEnv(config={"name": "Hangman-v0"})
    with pytest.raises(MissingPeerData) as caught:
        env.reset(seed=0)
    message = str(caught.value)
    assert "words" in message and "python -m nltk.downloader words" in message and "NLTK_DATA" in message
    assert calls == [] and nltk.download is not None and nltk.download.__name__ == "<lambda>"


def test_unsupported_games_fail_at_reset_with_the_reason():
    with pytest.raises(ValueError, match="more than two players"):
        TextArenaEnv(config={"name": "Codenames-v0"}).reset(seed=0)
    with pytest.raises(ValueError, match="network"):
        TextArenaEnv(config={"name": "TwentyQuestions-v0"}).reset(seed=0)


def _free_cell(text: str) -> str:
    return text.rsplit("Available Moves:", 1)[1].split(",")[0].strip().strip("'")


@pytest.mark.parametrize("opponent", ["random", "first_legal"])
def test_tictactoe_end_to_end_against_the_scripted_opponent(opponent):
    env = TextArenaEnv(config={"name": "TicTacToe-v0", "opponent": opponent})
    obs, _ = env.reset(seed=11)
    text = obs[0]["content"]
    total, turns = 0.0, 0
    while True:
        result = env.step(_free_cell(text))
        turns += 1
        total += result.reward
        text = result.observation[0]["content"]
        assert not result.info["invalid_move"]
        if result.terminated or result.truncated:
            break
        assert "[Player 1]" in text  # the opponent moved inside the policy's step
    assert result.terminated and turns <= 5 and total in (-1.0, 0.0, 1.0)
    assert total == result.info["peer_rewards"][0]


def test_first_legal_opponent_is_deterministic_and_policy_seat_one_moves_second():
    env = TextArenaEnv(config={"name": "TicTacToe-v0", "opponent": "first_legal", "policy_seat": 1})
    obs, _ = env.reset(seed=0)
    assert "[Player 0]" in obs[0]["content"]  # the opponent opened
    again = TextArenaEnv(config={"name": "TicTacToe-v0", "opponent": "first_legal", "policy_seat": 1})
    assert again.reset(seed=99)[0] == obs  # no randomness in its choice


def test_fixed_invalid_opponent_loses_by_textarenas_rules():
    env = TextArenaEnv(config={"name": "TicTacToe-v0", "opponent": "fixed", "opponent_move": "[9]"})
    env.reset(seed=0)
    result = env.step("[4]")
    assert result.terminated and result.reward == 1.0 and result.info["peer_rewards"] == {0: 1, 1: -1}


def test_adversarial_quick_towerofhanoi_is_clean():
    report = check_adversarial("textarena", config={"name": "TowerOfHanoi-v0"}, n_tasks=2, quick=True)
    assert report.ok, report.problems()


def test_adversarial_quick_guessthenumber_flags_textarenas_partial_credit():
    """GuessTheNumber pays the closeness of the last guess whenever the game ends (turn limit or two invalid
    moves), so any bracketed number beats the null agent: echoing the prompt's example "[5]" scores."""
    report = check_adversarial("textarena", config={"name": "GuessTheNumber-v0"}, n_tasks=2, quick=True)
    assert {outcome.probe for outcome in report.flagged} == {"echo"} and not report.leaks


def test_bandit_pays_the_wrong_button_more_than_the_best_one():
    """textarena 0.7.4 bug: Bandit's final choice is compared with a dict, so the best button pays 0."""
    env = TextArenaEnv(config={"name": "Bandit-v0"})
    env.reset(seed=3)
    gold = env.gold_actions()
    best_total, _ = play(env, gold)
    truth = env._game.state.game_state["ground_truth"]
    worst = min(truth, key=truth.get)
    env.reset(seed=3)
    worst_total, _ = play(env, gold[:-1] + [f"[{worst}]"])
    assert best_total == 0.0 < worst_total
    report = check_env("textarena", config={"name": "Bandit-v0"}, n_tasks=1, raise_on_failure=False)
    assert [failure.split(":")[0] for failure in report.failed] == ["gold[row 1] (Bandit-v0/seed-0)"]
