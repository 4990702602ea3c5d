"""``skyrl_gym``: one SkyRL-Gym env (``env.name``) played through skyrl's :class:`~skyrl_core.TextEnv` contract.

The mapping onto skyrl-gym's API (``skyrl_gym.make(name, env_config=..., extras=row)``, ``init(prompt) ->
(prompt, metadata)``, ``step(action) -> {observations, reward, done, metadata, postprocessed_action}``):

- ``reset`` makes a fresh peer env from the row as SkyRL's generator does: ``extras`` is the row without
  ``prompt`` and ``env_class``, plus ``max_turns`` (``env.max_turns``, which SkyRL's generator also sets), and
  ``env_config`` the peer's own config dataclass built from ``env.args``. The prompt is what ``init`` returns.
- ``step``'s observations are the peer's new messages, its reward the peer's turn reward (summed by skyrl like
  SkyRL sums them), ``terminated`` the peer's ``done``; the peer's metadata is ``info["skyrl_gym"]`` and a
  ``postprocessed_action`` is kept in ``info`` only (trajectories stay token-exact).
- A rejected action (empty, whitespace, over-long, not text) is passed to the peer's ``step`` as an empty
  reply, so the peer scores it as it scores any reply without an answer (text2sql's format penalty on the
  last turn); the observation says what was wrong, then what the peer said.
- The peers that only compute (gsm8k, gsm8k_multi_turn, aime) run under core's peer lock with Python's and
  numpy's global RNG seeded from the reset seed and the turn (:class:`skyrl_core.peer_rng.EpisodeRng`), and
  the process's states put back afterwards. The others (a database, a server, a
  subprocess) draw no random numbers in skyrl-gym 0.4.0 (tests check the process's RNG state across
  episodes) and run unguarded, so that slow I/O holds no process-wide lock.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import socket
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from skyrl_core import EnvConfig, StepResult, TextEnv
from skyrl_core.oracle import row_name
from skyrl_core.peer_rng import EpisodeRng

from skyrl_bridge_skyrl_gym.catalog import MULTI_TURN_FORMAT_SCORE, PEER_ENVS, multi_turn_range
from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_bridge_skyrl_gym.data import RowError, builtin_rows, load_rows, needs_hint, row_problem

TEXT2SQL_DIRS = {"synsql": "SynSQL-2.5M/databases", "spider": "spider/database", "bird": "bird/train/train_databases"}


class PeerEnvError(RuntimeError):
    """The peer env cannot be made for this task (missing database, no retrieval server, a row it refuses)."""


class SkyRLGymEnv(TextEnv):
    config_class = SkyRLGymConfig
    config: SkyRLGymConfig
    reward_range = (0.0, 1.0)  # gsm8k, the default env.name; reward_range_for gives each env's own

    @classmethod
    def reward_range_for(cls, config: EnvConfig) -> tuple[float, float]:
        if config.reward_range is not None:
            return tuple(config.reward_range)
        name = getattr(config, "name", "gsm8k")
        if name == "gsm8k_multi_turn":
            return multi_turn_range(config.max_turns)
        return PEER_ENVS[name].reward_range

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: SkyRLGymConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self._peer: Any = None
        self._seed: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_peer"] = None  # a live peer env (tools, sessions) stays here; the copy makes its own at reset
        return state

    @property
    def max_turns(self) -> int:
        """The peer's turn limit: ``env.max_turns`` for the multi-turn envs (passed to them), 1 for the others."""
        return self.config.max_turns if PEER_ENVS[self.config.name].multi_turn else 1

    # -- episode ----------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._close_peer()
        self._seed = seed
        prompt, info = super().reset(seed=seed, options=options)
        return prompt, {**info, "skyrl_gym_env": self.config.name}

    def build_prompt(self) -> list[dict[str, str]]:
        name = self.config.name
        problem = row_problem(self.task, name)
        if problem:
            raise RowError(f"task {row_name(self.task) or '(unnamed)'}: {problem}")
        extras = {key: copy.deepcopy(value) for key, value in self.task.items() if key not in ("prompt", "env_class")}
        extras["max_turns"] = self.config.max_turns
        prompt = [{"role": m["role"], "content": m["content"]} for m in self.task["prompt"]]
        self._peer = self._make_peer(extras)
        with self._rng_guard():
            shown, _metadata = self._peer.init(copy.deepcopy(prompt))
        return _messages(shown)

    def take_action(self, action: str) -> StepResult:
        return self._peer_step(action)

    def reject_action(self, problem: str) -> StepResult:
        """The peer scores the turn as an empty reply (its own handling of a reply with no answer)."""
        return self._peer_step("", problem=problem)

    def _peer_step(self, action: str, problem: str | None = None) -> StepResult:
        if self._peer is None:
            raise RuntimeError("step() before reset()")
        with self._rng_guard():
            out = self._peer.step(action)
        observation = _messages(out.get("observations") or [])
        info: dict[str, Any] = {}
        if out.get("metadata"):
            info["skyrl_gym"] = _plain(out["metadata"])
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = str(out["postprocessed_action"])
        if problem is not None:
            info["invalid_action"] = problem
            if observation and all(m["role"] == "user" for m in observation):
                observation = [{"role": "user", "content": "\n\n".join([problem, *(m["content"] for m in observation)])}]
            else:
                observation = [{"role": "user", "content": problem}, *observation]
        return StepResult(observation, float(out.get("reward") or 0.0), bool(out.get("done")), False, info)

    def close(self) -> None:
        self._close_peer()

    def _close_peer(self) -> None:
        peer, self._peer = self._peer, None
        if peer is not None:
            peer.close()

    # -- the peer env -----------------------------------------------------------------------------

    def _make_peer(self, extras: dict[str, Any]) -> Any:
        import skyrl_gym

        name = self.config.name
        env_config = self._peer_config()
        if name == "search":
            _check_server(env_config.search_url)
        if name == "text2sql":
            _check_database(env_config.db_path, extras)
        try:
            with self._rng_guard():
                return skyrl_gym.make(name, env_config=env_config, extras=extras)
        except AssertionError as exc:  # the peer's own check of the row
            raise PeerEnvError(f"skyrl-gym's {name!r} refused task {row_name(self.task) or '(unnamed)'}: "
                               f"{exc or 'a field is missing'}{needs_hint(name)}") from exc

    def _peer_config(self) -> Any:
        name, args = self.config.name, dict(self.config.args)
        if name == "text2sql":
            from skyrl_gym.envs.sql.env import Text2SQLEnvConfig

            return Text2SQLEnvConfig(**args)
        if name == "search":
            from skyrl_gym.envs.search.env import SearchEnvConfig

            return SearchEnvConfig(**args)
        return None

    def _rng_guard(self) -> contextlib.AbstractContextManager[None]:
        """Around a compute-only peer's call: the global RNGs seeded from the reset seed and turn, then restored."""
        if PEER_ENVS[self.config.name].io:
            return contextlib.nullcontext()
        digest = hashlib.sha256(f"{self._seed}/{self.turn}".encode()).digest()
        return EpisodeRng(int.from_bytes(digest[:4], "little")).active()

    # -- gold, ceiling, null ----------------------------------------------------------------------

    def _ground_truth(self) -> Any:
        key = "reward_model" if self.config.name == "aime" else "reward_spec"
        return (self.task.get(key) or {}).get("ground_truth")

    def gold_actions(self) -> list[str] | None:
        name, truth = self.config.name, self._ground_truth()
        if truth is None:
            return None
        if name == "gsm8k":
            return [f"#### {truth}"] if _gsm8k_pays(truth) else None
        if name == "gsm8k_multi_turn":
            if not _gsm8k_pays(truth):
                return None
            wrong = "0" if str(truth) != "0" else "1"
            # The best the peer pays: a formatted wrong answer on every turn but the last (0.2/max_turns each).
            return [f"#### {wrong}"] * (self.max_turns - 1) + [f"#### {truth}"]
        if name == "text2sql":
            return [f"<think>The reference query answers this.</think>\n<solution>{truth}</solution>"]
        if name == "search":
            from skyrl_gym.envs.search.utils import compute_score

            targets = truth.get("target") if isinstance(truth, Mapping) else None
            first = targets if isinstance(targets, str) else (list(targets)[0] if targets is not None and len(targets)
                                                              else None)
            gold = f"<answer>{first}</answer>"
            return [gold] if first is not None and compute_score(gold, truth) == 1 else None
        if name == "aime":
            from skyrl_gym.envs.aime.utils import compute_score

            gold = f"Answer: {truth}"
            return [gold] if compute_score(gold, str(truth))["score"] == 1.0 else None
        return None

    def reward_ceiling(self) -> float:
        """The top of the range, except a gsm8k row whose ground truth the peer's '#### N' parse never equals:
        then only the format bonus (gsm8k_multi_turn) or nothing (gsm8k) is reachable."""
        name, truth = self.config.name, self._ground_truth()
        if name in ("gsm8k", "gsm8k_multi_turn") and truth is not None and not _gsm8k_pays(truth):
            if name == "gsm8k":
                return 0.0
            per_turn, total = MULTI_TURN_FORMAT_SCORE / self.max_turns, 0.0
            for _ in range(self.max_turns):
                total += per_turn
            return total
        return self.reward_range[1]

    def null_action(self) -> str:
        if self.config.name == "text2sql":  # well-formed (no format penalty), answers nothing
            return "<think>I do not know.</think>\n<solution>SELECT 1 WHERE 1 = 0</solution>"
        return super().null_action()

    def get_metrics(self) -> dict[str, float]:
        metrics: dict[str, float] = {"turns": float(self.turn)}
        if self._peer is not None:
            for key, value in (self._peer.get_metrics() or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    metrics[str(key)] = float(value)
        return metrics

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        config = config if isinstance(config, SkyRLGymConfig) else SkyRLGymConfig()
        if not config.data_files:
            return builtin_rows(config.name, split)
        if split not in config.data_files:
            raise RowError(f"env.data_files has no split {split!r}; it has: {', '.join(sorted(config.data_files))}")
        return load_rows(config.data_files[split], config.name)


def _gsm8k_pays(truth: Any) -> bool:
    """Whether the peer's strict '#### N' parse can ever equal ``truth`` (it drops commas and '$')."""
    from skyrl_gym.envs.gsm8k.utils import compute_score

    return compute_score(f"#### {truth}", truth) == 1.0


def _messages(messages: Any) -> list[dict[str, str]]:
    out = []
    for message in messages or []:
        if not message:
            continue
        out.append({"role": str(message.get("role", "user")), "content": str(message.get("content", ""))})
    return out


def _plain(value: Any) -> Any:
    """The peer's metadata as JSON-able values (tuples to lists, other objects to their repr)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _check_server(url: str) -> None:
    """One TCP connect to the retrieval server (the peer would retry a dead one for about 45 s per search)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        raise PeerEnvError(f"skyrl-gym's search needs a retrieval server, and none answers at {url} ({exc}). Start "
                           f"one (e.g. `skyrl-search serve --port {port}`) or set env.args.search_url") from None


def _check_database(db_path: str, extras: Mapping[str, Any]) -> None:
    import os

    sub = TEXT2SQL_DIRS.get(str(extras.get("data")))
    db_id = str(extras.get("db_id"))
    path = os.path.join(db_path, sub or "?", db_id, f"{db_id}.sqlite")
    if not os.path.isfile(path):
        raise PeerEnvError(f"skyrl-gym's text2sql needs database files: {path} does not exist. Set env.args.db_path "
                           f"to the folder holding {sub}/<db_id>/<db_id>.sqlite (SkyRL's SQL data); nothing is "
                           f"downloaded")
