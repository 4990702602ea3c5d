"""``TextArenaEnv``: one seat of a TextArena game, played turn by turn by the policy.

The game is TextArena's own object (its registry's entry point and kwargs, without TextArena's observation
and action wrappers). Each turn the policy's text goes to ``game.step`` unchanged; in a two-player game the
scripted opponent (:mod:`.opponents`) then moves until it is the policy's turn again, so every ``step`` returns
the messages the policy's seat was shown since its last move. TextArena's final reward for the policy's seat is
paid once, on the turn that ends the game; every other turn pays 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core import StepResult, TextEnv
from skyrl_core.env import EnvConfig
from skyrl_core.peer_rng import EpisodeRng, global_rng_kept
from skyrl_core.registry import did_you_mean

from . import games
from .config import TextArenaEnvConfig
from .gold import GOLD
from .opponents import Opponent, was_invalid
from .peer import episode, make_game

_TASK_SEED_MIX = 1_000_003
_MAX_OPPONENT_MOVES = 1_000  # per policy turn: a game stuck on the opponent's seat ends as an error
TRAIN_ROWS, TEST_ROWS, TEST_OFFSET = 64, 32, 1_000_000


class TextArenaEnv(TextEnv):
    """A TextArena game (``env.name``) with the policy in one seat; see the module docstring."""

    config_class = TextArenaEnvConfig
    reward_range = (-1.0, 1.0)

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self.info: games.GameInfo = lookup(self.config.name)
        self._game: Any = None
        self._rng: EpisodeRng | None = None
        self._gold: list[str] | None = None
        self._game_limit: int | None = None
        self._reset_seed: int | None = None
        self._opponent_history: list[str] = []
        self._invalid_moves = 0
        self._final_reward: float | None = None

    # -- per-game declarations --------------------------------------------------------------------

    @classmethod
    def reward_range_for(cls, config: EnvConfig) -> tuple[float, float]:
        if config.reward_range is not None:
            return tuple(config.reward_range)
        try:
            return lookup(getattr(config, "name", "")).reward_range()
        except ValueError:
            return tuple(cls.reward_range)

    @property
    def max_turns(self) -> int:
        """The game's own limit in policy turns (with room for TextArena's invalid-move allowance), else
        ``config.max_turns``; an explicitly set ``env.max_turns`` lowers it."""
        if self._game_limit is None:
            return self.config.max_turns
        if "max_turns" in self.config.model_fields_set:
            return min(self._game_limit, self.config.max_turns)
        return self._game_limit

    def gold_actions(self) -> list[str] | None:
        return list(self._gold) if self._gold else None

    def get_metrics(self) -> dict[str, float]:
        reward = self._final_reward
        return {"finished": float(reward is not None), "invalid_moves": float(self._invalid_moves),
                "success": float(reward is not None and reward >= self.reward_ceiling() - 1e-9)}

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        """Deals of the configured game: ``train`` seeds 0..63, ``test`` seeds 1,000,000.. (32 rows)."""
        name = getattr(config, "name", None) or TextArenaEnvConfig().name
        start, count = (TEST_OFFSET, TEST_ROWS) if split == "test" else (0, TRAIN_ROWS)
        return [{"name": f"{name}/seed-{seed}", "game": name, "seed": seed} for seed in range(start, start + count)]

    # -- episode ------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    def build_prompt(self) -> list[dict[str, str]]:
        reason = self.info.unsupported_reason
        if reason:
            raise ValueError(f"TextArena game {self.info.id!r} is not supported by this bridge: {reason}")
        peer_seed = self._peer_seed()
        self._rng = EpisodeRng(peer_seed)
        self._opponent_history, self._invalid_moves, self._final_reward = [], 0, None
        self._opponent = Opponent(self.config.opponent, self.config.opponent_move, peer_seed + 1)
        kwargs = {**self.info.kwargs, **self.config.args}
        with episode(self._rng):
            try:
                self._game = make_game(self.info.entry_point, kwargs, self.info.id, self.info.nltk)
            except TypeError as exc:
                raise ValueError(f"TextArena game {self.info.id!r} rejected env.args {self.config.args}: {exc}") from exc
            self._game.reset(num_players=self.info.num_players, seed=peer_seed)
            state = self._game.state
            self._game_limit = self._limit(state)
            self._gold = self._compute_gold()
            done = self._opponents_move()
            text = self._drain()
        if done:  # a game that ends before the policy's first move is an env problem, not a turn
            raise RuntimeError(f"TextArena game {self.info.id!r} ended before the policy's first move")
        return [{"role": "user", "content": text}]

    def take_action(self, action: str) -> StepResult:
        return self._move(action, None)

    def reject_action(self, problem: str) -> StepResult:
        """An empty or over-long reply is played as an empty move, so TextArena's own invalid-move rules
        (its error allowance and penalty) judge it; the observation says why it was not read."""
        return self._move("", problem)

    # -- internals ----------------------------------------------------------------------------------

    def _peer_seed(self) -> int:
        task_seed = self.task.get("seed")
        if isinstance(task_seed, int):
            return (task_seed * _TASK_SEED_MIX + (self._reset_seed or 0)) % (2**31)
        if self._reset_seed is not None:
            return self._reset_seed % (2**31)
        return int(self.np_random.integers(0, 2**31))

    def _limit(self, state: Any) -> int | None:
        limit = getattr(state, "max_turns", None)
        if not isinstance(limit, int) or limit <= 0:
            return None
        allowance = getattr(state, "error_allowance", 1)
        allowance = allowance if isinstance(allowance, int) and allowance >= 0 else 1
        return math.ceil(limit / self.info.num_players) * (allowance + 1)

    def _compute_gold(self) -> list[str] | None:
        solver = GOLD.get(self.info.game)
        if solver is None or self.info.players != "single" or self.config.args:
            return None
        with global_rng_kept():
            try:
                moves = solver(self._game)
            except Exception:  # noqa: BLE001 - no gold for this deal rather than a failed reset
                return None
        return moves if moves and len(moves) <= self.max_turns else None

    @property
    def _seat(self) -> int:
        return self.config.policy_seat if self.info.players == "two" else 0

    def _move(self, action: str, problem: str | None) -> StepResult:
        if self._game is None or self._rng is None:
            raise RuntimeError("step() before reset()")
        with episode(self._rng):
            state = self._game.state
            done, _info = self._game.step(action)
            invalid = was_invalid(state, self._seat)
            self._invalid_moves += invalid
            if not done:
                done = self._opponents_move()
            text = self._drain()
            info: dict[str, Any] = {"game": self.info.id, "invalid_move": invalid}
            reward = 0.0
            if done:
                rewards, game_info = self._game.close()
                reward, info = self._final(rewards, game_info, info)
                text = "\n".join(t for t in (text, self._outcome_text(game_info, reward)) if t)
        if problem:
            info["rejected"] = problem
            text = f"{problem}\n{text}" if text else problem
        return StepResult([{"role": "user", "content": text or "(no new messages)"}], reward, done, False, info)

    def _final(self, rewards: Any, game_info: Any, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        raw = (rewards or {}).get(self._seat) if isinstance(rewards, Mapping) else None
        low, high = self.reward_range
        reward = float(raw) if isinstance(raw, (int, float)) and math.isfinite(raw) else 0.0
        clamped = min(max(reward, low), high)
        info = {**info, "peer_rewards": dict(rewards or {}), "peer_reward": raw,
                "reason": (game_info or {}).get(self._seat, {}).get("reason")}
        if clamped != reward or raw is None:
            info["reward_adjusted"] = f"TextArena paid {raw!r}; scored {clamped:g} (range {low:g}..{high:g})"
        self._final_reward = clamped
        return clamped, info

    def _outcome_text(self, game_info: Any, reward: float) -> str:
        reason = (game_info or {}).get(self._seat, {}).get("reason") if isinstance(game_info, Mapping) else None
        return f"[GAME] Game over. {reason or ''}".rstrip()

    def _opponents_move(self) -> bool:
        """Play the scripted seat until it is the policy's turn or the game ends; True when it ended."""
        if self.info.players != "two":
            return bool(self._game.state.done)
        state = self._game.state
        for _ in range(_MAX_OPPONENT_MOVES):
            if state.done:
                return True
            player = state.current_player_id
            if player == self._seat:
                return False
            _pid, observation = self._game.get_observation()
            self._opponent_history.append(self._render(observation or [], player, skip_own=False))
            move = self._opponent.choose(self.info.game, self._game, player, self._opponent_history)
            done, _info = self._game.step(move)
            state = self._game.state
            if done:
                return True
        raise RuntimeError(f"the scripted opponent made {_MAX_OPPONENT_MOVES} moves without the game returning "
                           f"to the policy's seat")

    def _drain(self) -> str:
        """The messages the policy's seat was sent since it last looked, as text."""
        state = self._game.state
        if state.current_player_id == self._seat and not state.done:
            _pid, observation = self._game.get_observation()
        else:
            observation = state.observations.get(self._seat, [])
            state.observations[self._seat] = []
        return self._render(observation or [], self._seat, skip_own=True)

    def _render(self, observation: Any, seat: int, *, skip_own: bool) -> str:
        if isinstance(observation, str):
            return observation
        roles = getattr(self._game.state, "role_mapping", {}) or {}
        lines = []
        for item in observation:
            sender, message = item[0], item[1]
            if skip_own and sender == seat:
                continue  # the policy's own move: already in its conversation
            name = "GAME" if sender == -1 else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}")
        return "\n".join(lines)


def lookup(name: str) -> games.GameInfo:
    """The registered game ``name`` (a ``-raw``/``-train`` variant plays its plain id's game)."""
    ids = games.registered_ids()
    if name in ids:
        plain = games.base_id(name)
        return games.game_info(plain if plain in ids else name)
    raise ValueError(f"unknown TextArena game {name!r}.{did_you_mean(name, games.catalogue_ids())} "
                     f"`skyrl envs --catalog textarena` lists them.")
