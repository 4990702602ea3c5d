"""Gold moves computed from a TextArena game's state right after reset (never from its observations).

One function per game (the folder name under ``textarena/envs``); each returns the moves, in TextArena's
own format, that win the game from its fresh state, or ``None`` when this deal has none it can compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any


def _guess_the_number(game: Any) -> list[str]:
    return [f"[{game.state.game_state['game_number']}]"]


def _tower_of_hanoi(game: Any) -> list[str]:
    moves: list[str] = []

    def solve(n: int, source: str, target: str, spare: str) -> None:
        if n:
            solve(n - 1, source, spare, target)
            moves.append(f"[{source} {target}]")
            solve(n - 1, spare, target, source)

    solve(len(game.state.game_state["towers"]["A"]), "A", "C", "B")
    return moves


def _mastermind(game: Any) -> list[str]:
    return ["[" + " ".join(str(n) for n in game.state.game_state["secret_code"]) + "]"]


def _sudoku(game: Any) -> list[str]:
    board, full = game.state.game_state["board"], game.full_grid
    return [f"[{r + 1} {c + 1} {full[r][c]}]" for r in range(9) for c in range(9) if board[r][c] == 0]


def _three_card_monte(game: Any) -> list[str]:
    return [f"[{game.ball_pos}]"]


def _secretary(game: Any) -> list[str]:
    draws = game.state.game_state["draws"]
    best = draws.index(max(draws))
    return ["[continue]"] * best + (["[accept]"] if best < len(draws) - 1 else [])


def _frozen_lake(game: Any) -> list[str] | None:
    grid = game.state.game_state["grid"]
    start, goal = tuple(game.state.game_state["player_pos"]), tuple(game.state.game_state["goal_pos"])
    size = len(grid)
    steps = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    seen, queue = {start: []}, deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return [f"[{move}]" for move in seen[cell]]
        for move, (dr, dc) in steps.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in seen and grid[nxt[0]][nxt[1]] != "H":
                seen[nxt] = [*seen[cell], move]
                queue.append(nxt)
    return None


def _bandit(game: Any) -> list[str]:
    """Press the best button every turn, then name it (the right answer; TextArena 0.7.4 pays it 0, see README)."""
    truth = game.state.game_state["ground_truth"]
    best = max(truth, key=truth.get)
    return [f"[{best}]"] * (game.num_turns + 1)  # num_turns presses, then the choice


GOLD: dict[str, Callable[[Any], list[str] | None]] = {
    "GuessTheNumber": _guess_the_number,
    "TowerOfHanoi": _tower_of_hanoi,
    "Mastermind": _mastermind,
    "Sudoku": _sudoku,
    "ThreeCardMonte": _three_card_monte,
    "Secretary": _secretary,
    "FrozenLake": _frozen_lake,
    "Bandit": _bandit,
}
"""The games with gold moves (by folder name); every other game has none."""
