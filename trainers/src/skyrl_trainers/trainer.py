"""``fsdp_grpo``: the driver loop. Rollouts with the engine, advantages, sharded updates, weight sync.

Each step: take ``batch_size`` tasks, let the generator play ``n_samples_per_prompt`` episodes per
task, assign advantages (:mod:`.credit`), plan mini/micro-batches over the ranks (:mod:`.batching`),
run the update on every rank (:mod:`.worker`), push the new weights into the engine (or, for an
``hf`` engine sharing a single in-process rank's weights, just mark a new weight version), then log,
call ``on_train_step_end`` and checkpoint. ``trainer.mode`` ``one_step_off`` and ``async`` overlap
generation with training (:mod:`.overlap`); this module's loop is ``sync``'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from skyrl_core.config import ResolvedConfig
from skyrl_core.engine import ClosableEngine, MemoryReleasingEngine
from skyrl_core.factory import ConfigError, env_class, generator_class
from skyrl_core.generator import request_seed
from skyrl_core.metrics import MetricsLogger
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.ray_cluster import connect_for_run, disconnect
from skyrl_core.trajectory import Trajectory, TrajectoryBatch

from skyrl_trainers.async_metrics import PolicyVersions
from skyrl_trainers.batching import plan_step, training_samples
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.credit import assign_advantages, group_scores
from skyrl_trainers.data import TaskStream, load_training_tasks
from skyrl_trainers.engine_setup import (
    alias_policy,
    build_engine,
    can_share_weights,
    check_engine_placement,
    engine_class,
    engine_config_for_policy,
    engine_metrics,
    sleeps_between_rollouts,
)
from skyrl_trainers.evaluation import HeldOutEval
from skyrl_trainers.memory import bound_onednn_primitive_cache, fix_malloc_thresholds, use_one_malloc_arena
from skyrl_trainers.numerics import decide_numerics
from skyrl_trainers.overlap import AsyncLoop, OneStepOffLoop, check_mode
from skyrl_trainers.progress import TrainingProgress
from skyrl_trainers.rng import rng_state, set_rng_state
from skyrl_trainers.run_folder import RunFolder
from skyrl_trainers.run_summary import RunClock, summarize
from skyrl_trainers.samples import write_samples
from skyrl_trainers.seeding import accepts_seed
from skyrl_trainers.signal import NoSignalMonitor, zero_variance_share
from skyrl_trainers.worker import WorkerSpec, accumulate
from skyrl_trainers.workers import make_worker_group

log = logging.getLogger(__name__)


class FSDPGRPOTrainer:
    """Entry point of the ``fsdp_grpo`` trainer: ``FSDPGRPOTrainer(resolved_config).fit()``."""

    def __init__(self, config: ResolvedConfig) -> None:
        if not isinstance(config.trainer, FSDPGRPOConfig):
            raise ConfigError(f"fsdp_grpo needs a trainer section validated as FSDPGRPOConfig, "
                              f"got {type(config.trainer).__name__}")
        self.config = config
        self.cfg: FSDPGRPOConfig = config.trainer
        self.decided = config  # with precision and TIS decided, by fit
        resume = config.run.resume
        self.run_folder = RunFolder(resume if resume else config.default_output_dir())
        self.training_started = False  # set once the step loop begins (fit removes a folder it made before)
        self.clock = RunClock()  # restarted by fit

    @classmethod
    def check_config(cls, config: ResolvedConfig) -> None:
        """Refuse options that contradict each other, before anything is loaded or written (``skyrl run``
        calls this before building the trainer, ``--print-config`` too). Nothing here depends on this
        machine: a GPU recipe checks out on a laptop."""
        check_mode(config, engine_class(config))
        check_engine_placement(config)
        engine_config_for_policy(config)  # e.g. engine.model set to another model than trainer.model

    def fit(self) -> dict[str, float]:
        """Train for ``trainer.steps`` steps (continuing a resumed run) and return a summary."""
        cfg, run = self.cfg, self.config.run
        self.clock = RunClock()
        self.check_config(self.config)  # also when built by other code than `skyrl run`
        use_one_malloc_arena()  # before the engine's and OpenMP's threads exist (see skyrl_trainers.memory)
        fix_malloc_thresholds()  # the rollout's large buffers are mapped, not left as holes in the heap
        bound_onednn_primitive_cache()  # before the first matmul, the precision probe's included
        self.decided, numerics = decide_numerics(self.config)  # self.config stays as given: the run folder saves it
        cfg = self.cfg = self.decided.trainer
        random.seed(run.seed)
        torch.manual_seed(run.seed)
        env_cls = env_class(self.config.env_id)
        stream = TaskStream(load_training_tasks(env_cls, self.config.env, cfg.train_files, cfg.data_split),
                            seed=run.seed, shuffle=cfg.shuffle)
        held_out = HeldOutEval(self.config, env_cls)  # its tasks load, or fail, before any model does
        resume_from = self.run_folder.latest_checkpoint() if run.resume else None
        resumed = torch.load(resume_from / "trainer_state.pt", weights_only=False) if resume_from else None
        start = resumed["step"] if resumed else 0
        shared = can_share_weights(self.config, engine_class(self.config))  # never off sync (its docstring)
        fresh, previous_config = not self.run_folder.path.exists(), self.run_folder.saved_config()
        self.run_folder.create(self.config.to_dict(), resuming=resumed is not None)
        print(f"run folder: {self.run_folder.path}", flush=True)
        print("\n".join(numerics), flush=True)
        self.training_started = False
        try:
            return self._train(start, resumed, resume_from, stream, held_out, shared=shared)
        except BaseException:
            if not self.training_started:  # leave no empty run behind, nor a config a resume never ran with
                self.run_folder.undo_create(fresh, previous_config)
                if fresh:
                    print(f"removed the run folder {self.run_folder.path}: the run failed before its first step",
                          file=sys.stderr, flush=True)
            raise

    def _train(self, start: int, resumed: dict[str, Any] | None, resume_from: Path | None, stream: TaskStream,
               held_out: HeldOutEval, shared: bool) -> dict[str, float]:
        """Build the engine, ranks and generator, then run the step loop (``fit`` after the folder exists);
        ``shared``: the engine generates with the trainer's own parameters."""
        cfg, run = self.cfg, self.config.run
        temperature = getattr(self.config.generator, "temperature", 1.0) or 1.0
        spec = WorkerSpec(cfg, temperature=temperature, seed=run.seed)
        self.resumed_state = resumed
        loop = asyncio.new_event_loop()
        engine = logger = workers = generator = None
        owns_ray = connect_for_run(self.config)  # before the engine and ranks, which join the same Ray
        try:
            if shared:  # one in-process rank: the engine generates with its parameters (no second copy)
                workers = make_worker_group(spec)
                engine, tokenizer = build_engine(self.decided, seed=run.seed + start, worker=workers.worker)
            else:  # the engine first: loading the policy once in the driver fills the model cache for the ranks
                engine, tokenizer = build_engine(self.decided, seed=run.seed + start)
                workers = make_worker_group(spec)
            generator = generator_class(self.config.generator_id)(
                self.config.generator, engine=engine, tokenizer=tokenizer, env_id=self.config.env_id,
                env_config=self.config.env)
            held_out.attach(engine, tokenizer)
            if resumed:
                workers.call("load_checkpoint", str(resume_from))
                stream.load_state_dict(resumed["data"])
                set_rng_state(resumed["rng"])
                self.run_folder.forget_after(start)
                held_out.load_history(self.run_folder.metrics)
            weight_sync = _WeightSync(workers, engine, loop, shared)
            weight_sync(changed=True)
            logger = MetricsLogger(self.run_folder.path, console=False, wandb_project=run.wandb_project,
                                   wandb_mode=run.wandb_mode, config=self.config.to_dict())
            step_loop = _StepLoop(self, workers, engine, generator, stream, loop, logger, weight_sync, held_out)
            self.training_started = True
            self.clock.setup_done()
            with TrainingProgress(total=cfg.steps, done=start, enabled=run.console) as progress:
                summary = step_loop.run(start, progress)
            if cfg.export:
                with self.clock.measure("export"):
                    workers.call("export", str(self.run_folder.export))
            print(f"run finished; its folder: {self.run_folder.path}", flush=True)
            return {"steps": summary.pop("steps"), **self.clock.summary(), **summary}
        finally:
            if logger is not None:
                logger.close()
            if generator is not None:  # its env workers on Ray, where placed there
                generator.close()
            held_out.close()
            if workers is not None:
                workers.close()
            _close_engine(engine, loop)
            disconnect(owns_ray)


def _close_engine(engine: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Close the engine while its event loop still runs, so its background tasks end cleanly."""
    if isinstance(engine, ClosableEngine):
        engine.close()
        loop.run_until_complete(asyncio.sleep(0))
    loop.close()


class _StepLoop:
    """The per-step work of :meth:`FSDPGRPOTrainer.fit`, kept apart from setup and teardown."""

    def __init__(self, trainer: FSDPGRPOTrainer, workers: Any, engine: Any, generator: Any, stream: TaskStream,
                 loop: asyncio.AbstractEventLoop, logger: MetricsLogger, weight_sync: _WeightSync,
                 held_out: HeldOutEval) -> None:
        self.trainer, self.cfg, self.run_folder = trainer, trainer.cfg, trainer.run_folder
        self.held_out = held_out
        self.workers, self.engine, self.generator = workers, engine, generator
        self.stream, self.loop, self.logger = stream, loop, logger
        self.sleeps = sleeps_between_rollouts(engine)
        self.weight_sync = weight_sync
        generator_cfg = trainer.config.generator
        self.no_signal = NoSignalMonitor(
            share=self.cfg.no_signal_share, patience=self.cfg.no_signal_patience,
            reward_range=held_out.reward_range,
            hints={"n_samples_per_prompt": getattr(generator_cfg, "n_samples_per_prompt", None),
                   "temperature": getattr(generator_cfg, "temperature", None), "model": self.cfg.model})
        self.groups: dict[int, dict[str, list[float]]] = {}  # step -> its groups' scores, until end_step
        self.credit: dict[int, list[float | None]] = {}  # step -> its advantages, until end_step
        self.versions: PolicyVersions | None = None  # the run's, for every mode (set in run)
        self.seeded = accepts_seed(generator)
        if not self.seeded:
            log.warning("generator %s takes no 'seed' argument in generate(): sampling is not reproducible "
                        "(the engine seeds requests in the order they arrive), nor is a resumed run",
                        type(generator).__name__)

    def run(self, start: int, progress: TrainingProgress) -> dict[str, float]:
        if start == 0 and self.held_out.due(0):  # the initial policy, before any mode's loop starts
            self.logger.log(0, self.loop.run_until_complete(self.evaluate(0, progress)))
        self.versions = PolicyVersions(self.engine, start)
        if self.cfg.mode != "sync":
            overlapped = OneStepOffLoop if self.cfg.mode == "one_step_off" else AsyncLoop
            return {**self.loop.run_until_complete(overlapped(self).run(start, progress)), **self.held_out.summary()}
        history: list[dict[str, float]] = []
        started = time.perf_counter()
        step = start
        for step in range(start + 1, self.cfg.steps + 1):
            metrics = self.step(step, progress)
            metrics.update(self.loop.run_until_complete(self.evaluate(step, progress)))
            history.append(metrics)
            if self.end_step(step, metrics, progress):
                self.checkpoint(step)
        return {**summarize(history, step, time.perf_counter() - started), **self.held_out.summary()}

    async def evaluate(self, step: int, progress: TrainingProgress) -> dict[str, float]:
        """``eval/*`` of the weights after ``step`` (0: before training) when an evaluation is due, else ``{}``
        (:mod:`.evaluation`); the caller logs them with its step."""
        if not self.held_out.due(step):
            return {}
        progress.evaluating(step, len(self.held_out.tasks))
        with self.trainer.clock.measure("evaluation"):
            metrics = await self.held_out.run(step)
        progress.evaluated(step, metrics, self.held_out.about)
        return metrics

    def end_step(self, step: int, metrics: dict[str, float], progress: TrainingProgress) -> bool:
        """Log the step and call the plugins' ``on_train_step_end``; whether a checkpoint is due now."""
        cfg = self.cfg
        groups = self.groups.pop(step, {})
        self.credit.pop(step, None)
        metrics.update(engine_metrics(self.engine))  # e.g. requests per engine replica
        metrics.update(self.no_signal.update(step, metrics.get("train/zero_variance_groups", 0.0), groups))
        self.trainer.clock.add_step(metrics)
        self.logger.log(step, metrics)
        get_plugin_manager().hook.on_train_step_end(step=step, metrics=metrics)  # observers are guarded
        note = self.no_signal.first_note(step)  # why a first step shows loss 0 and grad 0
        progress.step_done(step, metrics, note=note)
        if note and not progress.enabled:
            log.warning(note)
        due = bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps
        if due:
            progress.phase(step, "checkpoint")
        return due

    def step(self, step: int, progress: TrainingProgress) -> dict[str, float]:
        t0 = time.perf_counter()
        tasks = self.stream.next_batch(self.cfg.batch_size)
        progress.rollouts(step, len(tasks) * getattr(self.trainer.config.generator, "n_samples_per_prompt", 1))
        # per-step seed: a resumed run samples step N exactly as an uninterrupted one does
        seeded = {"seed": request_seed(self.trainer.config.run.seed, f"step{step}")} if self.seeded else {}
        assert self.versions is not None
        batch: TrajectoryBatch = self.loop.run_until_complete(self.versions.generate(self.generator, tasks, **seeded))
        if self.sleeps:  # free the engine's GPU memory for training; its weights are re-sent below
            self.loop.run_until_complete(self.engine.sleep(level=2))
        elif isinstance(self.engine, MemoryReleasingEngine):  # e.g. the hf engine's packed weights, stale after the update
            self.loop.run_until_complete(self.engine.release_memory())
        t1 = time.perf_counter()
        self.write_samples(step, batch.trajectories)
        progress.phase(step, "train")
        metrics: dict[str, float] = {**batch.metrics, **self.train(step, batch.trajectories)}
        t2 = time.perf_counter()
        progress.phase(step, "sync weights")
        self.sync_weights(changed=metrics["train/optimizer_steps"] > 0)
        self.versions.pushed(step)
        t3 = time.perf_counter()
        metrics.update({"time/generate_seconds": t1 - t0, "time/train_seconds": t2 - t1,
                        "time/sync_seconds": t3 - t2, "time/step_seconds": t3 - t0,
                        "throughput/train_tokens_per_second": metrics.pop("train/input_tokens") / max(t2 - t1, 1e-9),
                        # the generator's own count (the rollout is the whole generation phase in sync)
                        "throughput/generated_tokens_per_second": metrics.get("rollout/generated_tokens_per_second", 0.0),
                        "async/generation_idle_fraction": (t3 - t1) / max(t3 - t0, 1e-9),
                        "async/training_idle_fraction": 1.0 - (t2 - t1) / max(t3 - t0, 1e-9)})
        return metrics

    @functools.cached_property
    def carried_prompts(self) -> bool:
        """Whether the ranks run each prompt once a mini-batch, outside the rows (the plan counts that)."""
        return all(self.workers.call("carries_prompts"))

    def train(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """Advantages, batch plan and the update on every rank; metrics of the update."""
        cfg = self.cfg
        samples = training_samples(trajectories, self.advantages(step, trajectories))
        groups = self.groups[step] = group_scores(trajectories)
        metrics = {"train/samples": float(len(samples)), "train/excluded_samples": float(len(trajectories) - len(samples)),
                   "train/zero_variance_groups": zero_variance_share(groups, estimator=cfg.advantage)[0]}
        if not samples:  # e.g. every episode failed: keep the weights, log the step
            log.warning("step %d: no trainable samples (%d trajectories, all failed or empty)", step, len(trajectories))
            return {**metrics, "train/input_tokens": 0.0, "train/optimizer_steps": 0.0, "train/skipped_steps": 1.0}
        plans = plan_step(samples, world_size=self.workers.world_size, mini_batches=cfg.mini_batches,
                          micro_batch_tokens=cfg.micro_batch_tokens, carried_prompts=self.carried_prompts,
                          skip_zero_advantage=cfg.kl_coef == 0 and cfg.entropy_coef == 0)
        run = [s for rank in plans for plan in rank for s in plan.samples]
        metrics["train/zero_advantage_skipped"] = float(len(samples) - len(run))
        metrics["train/input_tokens"] = float(sum(len(s.input_ids) for s in run))
        metrics.update(train_metrics(self.workers.call("train_step", per_rank=plans)))
        metrics["train/advantage_abs_mean"] = sum(abs(s.advantage) for s in samples) / len(samples)
        return metrics

    def sync_weights(self, changed: bool) -> None:
        """Send the trainer's weights to the engine (always after a sleep, which dropped them)."""
        if self.sleeps:
            self.loop.run_until_complete(self.engine.wake_up(["weights"]))
        self.weight_sync(changed=changed or self.sleeps)
        if self.sleeps:
            self.loop.run_until_complete(self.engine.wake_up(["kv_cache"]))

    def advantages(self, step: int, trajectories: list[Trajectory]) -> list[float | None]:
        """The step's advantages (``None``: left out of the loss), computed once: the sample writer
        stores the values the update trains on."""
        if step not in self.credit:
            cfg = self.cfg
            self.credit[step] = assign_advantages(trajectories, estimator=cfg.advantage,
                                                  norm_by_std=cfg.grpo_norm_by_std,
                                                  child_advantage=cfg.child_advantage)
        return self.credit[step]

    def write_samples(self, step: int, trajectories: list[Trajectory]) -> None:
        """Copy ``samples_per_step`` root episodes with their trees to ``samples.jsonl`` (:mod:`.samples`)."""
        if self.cfg.samples_per_step:
            write_samples(self.run_folder.samples, step, trajectories, self.advantages(step, trajectories),
                          self.cfg.samples_per_step)

    def checkpoint(self, step: int, overlap_state: dict[str, Any] | None = None) -> None:
        """Weights, optimizer, data position and RNG; off sync also ``overlap_state`` (key ``async``)."""
        with self.trainer.clock.measure("checkpoint"):
            folder = self.run_folder.new_checkpoint(step)
            self.workers.call("save_checkpoint", str(folder))
            state = {"step": step, "data": self.stream.state_dict(), "rng": rng_state()}
            if overlap_state is not None:
                state["async"] = overlap_state
            torch.save(state, folder / "trainer_state.pt")
            self.run_folder.commit_checkpoint(step)


class _WeightSync:
    """Brings the engine up to the trainer's weights. A shared engine (see
    :func:`~skyrl_trainers.engine_setup.shared_engine`) already reads them: it is only re-pointed if the
    trainer's storage was replaced (a checkpoint load), and ``update_weights({})`` copies nothing but
    still waits for rows in flight and counts a new ``weight_version``."""

    def __init__(self, workers: Any, engine: Any, loop: asyncio.AbstractEventLoop, shared: bool) -> None:
        self.workers, self.engine, self.loop, self.shared = workers, engine, loop, shared

    def __call__(self, changed: bool) -> None:
        if not changed:
            return
        if self.shared:
            alias_policy(self.engine.model, self.workers.worker.model)
            self.loop.run_until_complete(self.engine.update_weights({}))
        else:
            self.loop.run_until_complete(self.engine.update_weights(self.workers.call("full_state_dict")[0]))


def train_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Combine the sums the ranks return into per-step means."""
    total: dict[str, float] = {}
    for values in per_rank:
        accumulate(total, values)
    tokens = max(total.get("tokens", 0.0), 1.0)
    steps = max(per_rank[0].get("optimizer_steps", 1.0), 1.0)  # each rank took the same optimizer steps
    off_policy = {  # only with trainer.off_policy.tis != none
        "train/is_ratio_mean": total["is_ratio_sum"] / tokens,
        "train/is_ratio_max": total.get("is_ratio_max", 0.0),
        "train/tis_clip_fraction": total.get("tis_clipped_sum", 0.0) / tokens,
        "train/is_unknown_fraction": total.get("is_unknown_sum", 0.0) / tokens,
    } if "is_ratio_sum" in total else {}
    return {
        "train/loss": total.get("loss", 0.0) / steps,
        "train/policy_loss": total.get("policy_loss", 0.0) / steps,
        "train/kl": total.get("kl_sum", 0.0) / tokens,
        "train/entropy": total.get("entropy_sum", 0.0) / tokens,
        "train/clip_fraction": total.get("clipped_sum", 0.0) / tokens,
        "train/logprob_gap_mean": total.get("logprob_gap_sum", 0.0) / tokens,
        "train/logprob_gap_max": total.get("logprob_gap_max", 0.0),
        "train/grad_norm": per_rank[0].get("grad_norm_sum", 0.0) / steps,
        "train/lr": per_rank[0].get("lr_sum", 0.0) / steps,
        "train/tokens": total.get("tokens", 0.0),
        "train/optimizer_steps": steps,
        "train/skipped_steps": per_rank[0].get("skipped_steps", 0.0),
        **off_policy,
    }
