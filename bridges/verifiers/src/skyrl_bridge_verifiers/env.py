"""``VerifiersEnv``: a verifiers (v1) env as a SkyRL TextEnv; the policy plays its agent seat turn by turn.

reset starts the peer's own episode loop (``Env.run``) on the bridge's background event loop and returns
the first prompt it sends the policy's seat; each step hands the action back to that loop and returns
the NEW messages of its next prompt, or ends with the reward the task's own rewards give the policy's
trace (paid once, on the last turn). Rejected actions (empty, over-long) reach the peer as an empty
reply, scored by the task like any other reply.

Every peer call runs with the episode's own global ``random`` and ``numpy.random`` states installed
(:class:`skyrl_core.peer_rng.EpisodeRng`, seeded from the reset seed; the process's states kept when there is
none) under core's process-wide peer lock, held by a worker thread while the background loop runs the call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any, ClassVar

from skyrl_core import StepResult, TextEnv
from skyrl_core.env import EnvConfig, Message
from skyrl_core.peer_loop import submit
from skyrl_core.peer_rng import EpisodeRng, global_rng_kept

from .config import VerifiersEnvConfig
from .peer import PeerEpisode, load_peer, peer_rows, score_reply


class VerifiersEnv(TextEnv):
    config_class: ClassVar[type[EnvConfig]] = VerifiersEnvConfig
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.2)  # the bundled example's (the default env.name)
    dataset_option: ClassVar[str | None] = "data_files"
    config: VerifiersEnvConfig

    def __init__(self, task: dict[str, Any] | None = None, config: Any = None) -> None:
        super().__init__(task, config)
        self._episode: PeerEpisode | None = None
        self._seed: int | None = None
        self._rng: EpisodeRng | None = None
        self._last: dict[str, Any] = {}
        self._ceiling: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_episode"] = None  # lives on the background loop of this process only
        return state

    # -- the peer ------------------------------------------------------------------------------------------

    @property
    def peer(self):
        return load_peer(self.config.name, self.config.args)

    @classmethod
    def reward_range_for(cls, config: EnvConfig) -> tuple[float, float]:
        if config.reward_range is not None:
            return tuple(config.reward_range)
        return load_peer(config.name, config.args).reward_range

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        config = config if config is not None else cls.config_class()
        return peer_rows(load_peer(config.name, config.args), config.name, config.data_files, config.max_rows)

    @property
    def max_turns(self) -> int:
        return 1 if self.peer.single_turn else self.config.max_turns

    def _peer_task(self) -> Any:
        if "data" not in self.task:
            raise ValueError("a verifiers task row needs its 'data' (the taskset's TaskData fields); rows come from "
                             "load_dataset() or env.data_files")
        return self.peer.task(self.task["data"])

    async def _call(self, coroutine: Any) -> Any:
        """The episode's peer call; the lock is held by a worker thread, never across this loop's awaits."""
        return await asyncio.to_thread(self._call_sync, coroutine, self._rng)

    def _call_sync(self, coroutine: Any, rng: EpisodeRng | None = None) -> Any:
        """``coroutine`` run on the background loop with ``rng``'s global states active (else the process's kept)."""
        with rng.active() if rng is not None else global_rng_kept():
            future = submit(coroutine)
            try:
                return future.result(self.config.peer_timeout_s)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise

    # -- the episode ---------------------------------------------------------------------------------------

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        self._seed = seed
        return await super().areset(seed=seed, options=options)

    async def abuild_prompt(self) -> list[Message]:
        self.close()
        self._last, self._ceiling = {}, None
        self._rng = EpisodeRng(self._seed) if self._seed is not None else None
        self._episode = PeerEpisode(self.peer, self._peer_task(), seat=self.config.seat, max_turns=self.max_turns)
        event = await self._call(self._episode.start())
        if event[0] == "ask":
            return event[1]
        if event[0] == "error":
            raise event[1]
        raise RuntimeError(f"{self.config.name}: the env's loop ended before the policy's seat was asked to reply")

    def _result(self, event: tuple, note: list[Message] | None = None) -> StepResult:
        kind = event[0]
        if kind == "error":
            raise event[1]
        info: dict[str, Any] = {}
        if kind == "ask":
            return StepResult([*(note or []), *event[1]], 0.0, False, False, info)
        self._last = event[2]
        info = {"rewards": dict(event[2]["rewards"]), "stop": event[2]["stop"]}
        terminated = event[2]["stop"] != "max_turns"
        return StepResult(list(note or []), float(event[1]), terminated, not terminated, info)

    async def atake_action(self, action: str) -> StepResult:
        return self._result(await self._call(self._episode.act(action)))

    def reject_action(self, problem: str) -> StepResult:
        """The peer scores a rejected action as an empty reply (its own rewards decide what that is worth)."""
        return self._rejected(self._call_sync(self._episode.act(""), self._rng), problem)

    async def areject_action(self, problem: str) -> StepResult:
        return self._rejected(await self._call(self._episode.act("")), problem)

    def _rejected(self, event: tuple, problem: str) -> StepResult:
        result = self._result(event, note=[{"role": "user", "content": problem}])
        return result._replace(info={**result.info, "invalid_action": problem})

    def close(self) -> None:
        episode, self._episode = getattr(self, "_episode", None), None
        if episode is not None and episode._runner is not None and not episode._runner.done():
            submit(episode.cancel())

    # -- oracle, checks and metrics ------------------------------------------------------------------------

    def gold_actions(self) -> list[str] | None:
        data = dict(self.task.get("data") or {})
        if self.config.gold_template:
            try:
                return [self.config.gold_template.format(**data)]
            except (KeyError, IndexError, ValueError):
                return None
        gold = getattr(self._peer_task(), "gold_reply", None)
        if callable(gold):
            reply = gold()
            return [reply] if isinstance(reply, str) else list(reply) if reply else None
        return None

    def reward_ceiling(self) -> float:
        """A single-turn task's ceiling is what its own rewards give the gold reply (a format reward it misses,
        a weight it cannot earn); otherwise the top of the range."""
        if self._ceiling is None:
            gold = self.gold_actions()
            if gold and self.peer.single_turn:
                self._ceiling = float(self._call_sync(score_reply(self.peer, self._peer_task(), gold[0])))
            else:
                self._ceiling = float(self.reward_range[1])
        return self._ceiling

    def get_metrics(self) -> dict[str, float]:
        metrics = {f"reward_{name}": float(value) for name, value in self._last.get("rewards", {}).items()}
        metrics.update({name: float(value) for name, value in self._last.get("metrics", {}).items()})
        return metrics
