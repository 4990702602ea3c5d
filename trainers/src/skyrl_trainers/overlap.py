"""``trainer.mode`` ``one_step_off`` and ``async``: generation runs while the trainer trains.

Both run as coroutines on the trainer's event loop. The engine decodes on its own thread (or
process); the blocking trainer calls (``workers.call``: the update, ``full_state_dict``, checkpoints)
run on one dedicated trainer thread, so generation keeps going meanwhile. The policy ``version`` is the
number of steps trained; the engine gets each new version through ``update_weights`` (never shared
storage), and a group's staleness when trained is the trainer's version minus the oldest version among
its tokens (the version at which it was submitted when the generator records none).

* ``one_step_off``: step N trains on the batch generated while step N-1 trained, so every batch but
  the first is exactly one version stale. Same tasks and per-step seeds as ``sync``. A checkpoint
  holds the batch already generated for the next step, so a resumed run continues exactly.
* ``async``: ``generation_workers`` producers each pull ONE task from the stream (by its index in
  the stream), generate its group with seed ``request_seed(run.seed, "task<index>")`` and put it into
  the buffer; a :class:`~.staleness.StalenessManager` admits submissions. The trainer takes
  ``batch_size`` groups per step (dropping, or keeping, those staler than ``max_staleness``), trains,
  and pushes the weights. A checkpoint holds the trained/dropped task indexes
  (:class:`~.data.ConsumedTasks`); groups generated but not trained are generated again after resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from skyrl_core.config import ResolvedConfig
from skyrl_core.engine import InferenceEngine
from skyrl_core.factory import ConfigError
from skyrl_core.generator import request_seed
from skyrl_core.trajectory import Trajectory, TrajectoryBatch

from skyrl_trainers.async_metrics import (
    IdleClock,
    PolicyVersions,
    combine_rollout_metrics,
    generated_tokens,
    versions_per_trajectory,
)
from skyrl_trainers.data import ConsumedTasks
from skyrl_trainers.run_summary import summarize
from skyrl_trainers.staleness import StalenessManager

log = logging.getLogger(__name__)


def check_mode(config: ResolvedConfig, engine_cls: Any) -> None:
    """Refuse combinations the overlapped modes cannot run, saying why (``sync`` accepts everything)."""
    cfg = config.trainer
    if cfg.mode == "sync":
        return
    if getattr(config.engine, "enable_sleep_mode", False):
        raise ConfigError(f"trainer.mode={cfg.mode} generates while the trainer trains, but engine.enable_sleep_mode="
                          "true frees the engine's memory for training between rollouts; turn sleep mode off "
                          "(and give the engine its own memory) or use trainer.mode=sync")
    from skyrl_core.engines.openai import OpenAIEngine  # its update_weights refuses: the server owns the weights

    takes_updates = isinstance(engine_cls, type) and issubclass(engine_cls, InferenceEngine)
    if not takes_updates or issubclass(engine_cls, OpenAIEngine):
        raise ConfigError(f"trainer.mode={cfg.mode} pushes every new policy version into the engine while it "
                          f"generates, but engine {config.engine_id!r} cannot take weight updates; use the hf or "
                          "vllm engine")
    if cfg.mode == "one_step_off" and cfg.max_staleness < 1:
        raise ConfigError("trainer.mode=one_step_off trains every batch one policy version after the one that "
                          "generated it, but trainer.max_staleness=0 allows none; use max_staleness>=1 or mode=sync")


class _Overlapped:
    """What both modes share: the trainer thread, weight pushes, idle accounting, step bookkeeping."""

    def __init__(self, steps: Any) -> None:  # steps: trainer._StepLoop
        self.steps, self.cfg = steps, steps.cfg
        self.engine, self.generator, self.stream, self.workers = steps.engine, steps.generator, steps.stream, steps.workers
        self.run_seed = steps.trainer.config.run.seed
        resumed = getattr(steps.trainer, "resumed_state", None) or {}
        self.resumed: dict[str, Any] = resumed.get("async") or {}
        self.trainer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        self.clock = IdleClock()
        self.versions: PolicyVersions = steps.versions  # the run's: set before any loop starts
        self.version = 0
        self.tokens_generated = 0  # by every generate call so far (groups later dropped included)

    async def in_trainer(self, fn: Any, *args: Any) -> Any:
        """Run a blocking trainer call on the trainer thread while the event loop keeps generating."""
        return await asyncio.get_running_loop().run_in_executor(self.trainer_thread, fn, *args)

    def seeded(self, key: str) -> dict[str, int]:
        return {"seed": request_seed(self.run_seed, key)} if self.steps.seeded else {}

    async def generate(self, tasks: list[dict[str, Any]], key: str) -> TrajectoryBatch:
        self.clock.begin()
        try:
            batch = await self.versions.generate(self.generator, tasks, **self.seeded(key))
        finally:
            self.clock.end()
        self.tokens_generated += generated_tokens(batch.trajectories)
        return batch

    async def push_weights(self, version: int, changed: bool) -> None:
        """Bring the engine to the trainer's weights, then count ``version`` as the engine's."""
        if changed:
            state = await self.in_trainer(self.workers.call, "full_state_dict")
            self.versions.pushing(version)
            await self.engine.update_weights(state[0])
        self.versions.pushed(version)
        self.version = version

    async def train(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        self.steps.write_samples(step, trajectories)
        return await self.in_trainer(self.steps.train, step, trajectories)

    def timing(self, marks: dict[str, float], idle_before: float, tokens_before: int,
               metrics: dict[str, float]) -> dict[str, float]:
        wall = max(marks["end"] - marks["start"], 1e-9)
        train = marks["trained"] - marks["got_batch"]
        return {"time/wait_seconds": marks["got_batch"] - marks["start"], "time/train_seconds": train,
                "time/sync_seconds": marks["end"] - marks["trained"], "time/step_seconds": wall,
                "throughput/train_tokens_per_second": metrics.pop("train/input_tokens") / max(train, 1e-9),
                "throughput/generated_tokens_per_second": (self.tokens_generated - tokens_before) / wall,
                "async/generation_idle_fraction": min((self.clock.idle_seconds() - idle_before) / wall, 1.0),
                "async/training_idle_fraction": 1.0 - train / wall,
                "async/policy_version": float(self.version)}

    async def end_step(self, step: int, metrics: dict[str, float], progress: Any, state: Any) -> None:
        if self.steps.end_step(step, metrics, progress):
            await self.in_trainer(self.steps.checkpoint, step, state())

    def close(self) -> None:
        self.trainer_thread.shutdown(wait=True)


@dataclass
class _Prefetched:
    batch: TrajectoryBatch
    version: int  # policy version whose weights generated it


class OneStepOffLoop(_Overlapped):
    """Step N trains on the batch generated while step N-1 trained (staleness exactly 1 after step 1)."""

    async def fetch(self, step: int) -> _Prefetched:
        version = self.version
        tasks = self.stream.next_batch(self.cfg.batch_size)  # the same tasks and seeds as sync's step
        return _Prefetched(await self.generate(tasks, f"step{step}"), version)

    async def run(self, start: int, progress: Any) -> dict[str, float]:
        self.version = start
        history: list[dict[str, float]] = []
        started = time.perf_counter()
        saved = self.resumed.get("prefetched")
        current: asyncio.Future[_Prefetched] | None = None
        if saved is not None and start < self.cfg.steps:
            current = asyncio.get_running_loop().create_future()
            current.set_result(saved)
        upcoming: asyncio.Task[_Prefetched] | None = None
        step = start
        try:
            if current is None and start < self.cfg.steps:
                current = asyncio.ensure_future(self.fetch(start + 1))
            for step in range(start + 1, self.cfg.steps + 1):
                marks = {"start": time.perf_counter()}
                idle, tokens = self.clock.idle_seconds(), self.tokens_generated
                assert current is not None
                prefetched = await current
                marks["got_batch"] = time.perf_counter()
                upcoming = asyncio.ensure_future(self.fetch(step + 1)) if step < self.cfg.steps else None
                metrics = {**prefetched.batch.metrics, **await self.train(step, prefetched.batch.trajectories)}
                marks["trained"] = time.perf_counter()
                if upcoming is not None:
                    await asyncio.wait([upcoming])  # its result (or error) is taken at the next step
                await self.push_weights(step, changed=metrics["train/optimizer_steps"] > 0)
                marks["end"] = time.perf_counter()
                staleness = float(step - 1 - prefetched.version)
                metrics.update(self.timing(marks, idle, tokens, metrics))
                metrics.update({"async/staleness_mean": staleness, "async/staleness_max": staleness,
                                "async/dropped_groups": 0.0, "async/buffer_depth": float(upcoming is not None)})
                per_trajectory = versions_per_trajectory(prefetched.batch.trajectories)
                if per_trajectory is not None:
                    metrics["async/policy_versions_per_trajectory"] = per_trajectory
                metrics.update(await self.steps.evaluate(step, progress))  # nothing generates meanwhile
                history.append(metrics)
                current, upcoming = upcoming, None
                await self.end_step(step, metrics, progress, lambda ahead=current: {
                    "mode": "one_step_off", "version": self.version,
                    "prefetched": ahead.result() if ahead is not None else None})
        finally:
            for pending in (current, upcoming):
                if pending is not None and not pending.done():
                    pending.cancel()
            self.close()
        return summarize(history, step, time.perf_counter() - started)


@dataclass
class _Group:
    index: int  # the task's place in the stream
    batch: TrajectoryBatch
    submitted: int  # policy version when its generation started


class AsyncLoop(_Overlapped):
    """K producers generate one task group each into a buffer; the trainer takes ``batch_size`` per step."""

    def __init__(self, steps: Any) -> None:
        super().__init__(steps)
        cfg = self.cfg
        self.workers_count = cfg.generation_workers or 2 * cfg.batch_size
        self.consumed = ConsumedTasks()
        self.buffer: asyncio.Queue[_Group | BaseException] | None = None
        self.manager: StalenessManager | None = None

    async def produce(self) -> None:
        assert self.manager is not None and self.buffer is not None
        while True:
            await self.manager.acquire()
            index = self.consumed.next_index()
            version = self.version
            try:
                batch = await self.generate([self.stream.task_at(index)], f"task{index}")
            except Exception as exc:  # noqa: BLE001 - the trainer raises it
                self.buffer.put_nowait(exc)
                return
            for t in batch.trajectories:
                t.metrics["task_index"] = float(index)
            self.manager.generated()
            self.buffer.put_nowait(_Group(index, batch, version))

    async def take(self, count: int) -> tuple[list[tuple[_Group, int]], int]:
        """``count`` groups with their staleness, and how many stale groups were dropped on the way."""
        assert self.manager is not None and self.buffer is not None
        taken: list[tuple[_Group, int]] = []
        dropped = 0
        while len(taken) < count:
            item = await self.buffer.get()
            if isinstance(item, BaseException):
                raise item
            staleness = self.version - self.versions.oldest(item.batch.trajectories, item.submitted)
            if staleness > self.cfg.max_staleness:
                if self.cfg.stale_groups == "drop":
                    log.info("dropped task %d's group: %d versions stale (max_staleness=%d)", item.index,
                             staleness, self.cfg.max_staleness)
                    self.manager.taken(accepted=False)
                    self.consumed.finish(item.index, trained=False)
                    dropped += 1
                    continue
                log.warning("training task %d's group %d versions stale (max_staleness=%d, stale_groups=keep)",
                            item.index, staleness, self.cfg.max_staleness)
            self.manager.taken(accepted=True)
            taken.append((item, staleness))
        return taken, dropped

    def state(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"mode": "async", "version": self.version, "consumed": self.consumed.state_dict(),
                "buffer": {"batch_size": cfg.batch_size, "generation_workers": self.workers_count,
                           "max_staleness": cfg.max_staleness, "stale_groups": cfg.stale_groups,
                           "untrained": "generated again after resume"}}

    async def run(self, start: int, progress: Any) -> dict[str, float]:
        cfg = self.cfg
        self.version = start
        if "consumed" in self.resumed:
            self.consumed.load_state_dict(self.resumed["consumed"])
        elif start:  # a checkpoint of another mode: continue after the tasks its steps drew
            self.consumed.load_state_dict({"below": self.stream.position, "done": [], "frontier": self.stream.position})
        self.manager = StalenessManager(self.workers_count, cfg.batch_size, cfg.max_staleness, version=start)
        self.buffer = asyncio.Queue()
        producers = [asyncio.ensure_future(self.produce()) for _ in range(self.workers_count)]
        history: list[dict[str, float]] = []
        started = time.perf_counter()
        step = start
        try:
            for step in range(start + 1, cfg.steps + 1):
                marks = {"start": time.perf_counter()}
                idle, tokens = self.clock.idle_seconds(), self.tokens_generated
                groups, dropped = await self.take(cfg.batch_size)
                marks["got_batch"] = time.perf_counter()
                trajectories = _distinct_groups([g.batch for g, _ in groups])
                metrics = {**combine_rollout_metrics([g.batch.metrics for g, _ in groups]),
                           **await self.train(step, trajectories)}
                marks["trained"] = time.perf_counter()
                for group, _ in groups:
                    self.consumed.finish(group.index, trained=True)
                await self.push_weights(step, changed=metrics["train/optimizer_steps"] > 0)
                self.manager.set_version(step)  # only now: groups submitted from here use the new weights
                marks["end"] = time.perf_counter()
                staleness = [s for _, s in groups]
                metrics.update(self.timing(marks, idle, tokens, metrics))
                metrics.update({"async/staleness_mean": sum(staleness) / len(staleness),
                                "async/staleness_max": float(max(staleness)), "async/dropped_groups": float(dropped),
                                "async/buffer_depth": float(self.buffer.qsize())})
                per_trajectory = versions_per_trajectory(trajectories)
                if per_trajectory is not None:
                    metrics["async/policy_versions_per_trajectory"] = per_trajectory
                metrics.update(await self.steps.evaluate(step, progress))  # beside the producers, no push meanwhile
                history.append(metrics)
                await self.end_step(step, metrics, progress, self.state)
        finally:
            for producer in producers:
                producer.cancel()
            await asyncio.gather(*producers, return_exceptions=True)
            self.close()
        summary = summarize(history, step, time.perf_counter() - started)
        summary["async/dropped_groups"] = float(self.manager.dropped)
        return summary


def _distinct_groups(batches: list[TrajectoryBatch]) -> list[Trajectory]:
    """The batches' trajectories, with a task drawn twice in one step (two epochs) kept as two GRPO groups."""
    seen: dict[str, int] = {}
    out = []
    for batch in batches:
        ids = {t.group_id for t in batch.trajectories}
        repeat = {gid: seen.get(gid, 0) for gid in ids}
        for gid in ids:
            seen[gid] = seen.get(gid, 0) + 1
        for t in batch.trajectories:
            if repeat[t.group_id]:
                t.group_id = f"{t.group_id}#{repeat[t.group_id]}"
            out.append(t)
    return out
