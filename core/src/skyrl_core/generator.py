"""The default multi-turn generator: many episodes at once on asyncio, token in, token out.

Each episode: render the prompt with the chat template, ask the engine for a turn, step the env
with the decoded text, append the observation's template tokens (loss mask 0), and repeat until the
env terminates or truncates or a budget runs out. Generated ids are kept exactly as the engine
returned them. A failing env or engine call ends only its own episode (``Trajectory.error``).

Every engine request carries its own sampling seed, :func:`request_seed` of the batch seed and the
request's place in the batch (task id, sample, turn), never of the order requests reach the engine.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from skyrl_core.chat import ChatRenderer, ChatTokenizer
from skyrl_core.engine import GenerateOutput, InferenceEngine, SamplingParams
from skyrl_core.env import EnvConfig, EpisodeEnv
from skyrl_core.env_pool import WORKER_LOST, RemoteEnv
from skyrl_core.factory import env_class, validate_config
from skyrl_core.plugins import get_plugin_manager, get_registry
from skyrl_core.trajectory import Trajectory, TrajectoryBatch, Turn

if TYPE_CHECKING:
    from skyrl_core.env_pool import RayEnvPool

log = logging.getLogger(__name__)


_BATCH_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("skyrl_batch_seed", default=None)
# (root trajectory, its key) of the episode a generate() task plays: a task repeated in one batch gets
# "<id>#<k>/<sample>" for its k-th repeat, so the copies do not sample the same tokens
_EPISODE_KEY: contextvars.ContextVar[tuple[Trajectory, str] | None] = contextvars.ContextVar(
    "skyrl_episode_key", default=None)


def request_seed(seed: int, key: str) -> int:
    """The sampling seed of one engine request: a stable hash of the batch ``seed`` and ``key``.

    ``key`` names the request's place in the batch (e.g. ``"<task id>/<sample>/t<turn>"``), not its
    arrival: concurrent episodes reach the engine in an order set by asyncio and env/sandbox timing,
    which no seed makes reproducible, so an engine that drew a seed per request as they arrive would
    sample differently on every run. A non-negative 63-bit int (blake2b of ``f"{seed}:{key}"``).
    """
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class EpisodeStop(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raise from an engine wrapper, env or generator subclass to end an episode cleanly.

    The episode keeps what it has, gets ``stop_reason`` and no ``error``, so it is still trained
    (e.g. a tree-wide token budget running out).
    """

    def __init__(self, stop_reason: str, message: str = "") -> None:
        super().__init__(message or stop_reason)
        self.stop_reason = stop_reason


class GeneratorConfig(BaseModel):
    """Options of the ``default`` generator (section ``generator`` of a run config)."""

    model_config = ConfigDict(extra="forbid")

    n_samples_per_prompt: int = Field(4, ge=1, description="GRPO group size: samples per task.")
    max_turns: int | None = Field(None, ge=1, description="Overrides the env's max_turns when set.")
    max_tokens_per_turn: int = Field(256, ge=1, description="Generation cap for one model turn.")
    max_total_tokens: int = Field(1024, ge=1, description="Cap on generated tokens over the episode.")
    max_context_length: int = Field(2048, ge=8, description="Prompt + response never exceeds this.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: the smallest set of tokens holding "
                         "this much probability.")
    top_k: int = Field(-1, description="Sample among the k most likely tokens; -1 disables it.")
    stop: list[str] = Field(default_factory=list, description="Stop strings besides those the env's spec declares.")
    step_wise: bool = Field(False, description="Emit one training sample per turn.")
    max_concurrency: int = Field(256, ge=1, description="Episodes in flight at once.")
    end_of_turn_token_id: int | None = Field(None, description="Defaults to the tokenizer's EOS id.")
    seed: int = Field(0, description="Episode i of a task is reset with seed + i; the sampling seed of generate() "
                      "calls that pass none.")
    # where envs run (docs/packages/core.md: "Env workers on Ray")
    env_placement: Literal["local", "ray"] = Field(
        "local", description="local: envs in this process; ray: in env worker actors placed on Ray nodes that "
        "offer the env's resources (run.ray_address joins a cluster, else a local Ray is started).")
    envs_per_worker: int = Field(8, ge=1, description="env_placement=ray: live envs (and sandboxes) per env worker.")
    max_env_workers: int = Field(16, ge=1, description="env_placement=ray: most env workers started at once "
                                 "(also bounded by what the cluster's nodes offer).")
    env_resources: dict[str, float] | None = Field(
        None, description="env_placement=ray: Ray resources per env worker, instead of what the env declares "
        "(e.g. {docker: 1}).")
    max_env_retries: int = Field(2, ge=0, description="env_placement=ray: times an episode whose env worker was lost "
                                 "is played again on another; then its group is dropped.")
    env_call_timeout: float = Field(900.0, gt=0, description="env_placement=ray: seconds a reset/step may take "
                                    "before its worker counts as lost (killed and replaced).")


class MultiTurnGenerator:
    """Runs episodes of one env against one engine. Registered as generator ``default``."""

    def __init__(self, config: GeneratorConfig, *, engine: InferenceEngine, tokenizer: ChatTokenizer,
                 env_id: str, env_config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, config.end_of_turn_token_id)
        self.env_id = env_id
        self.env_cls = env_class(env_id)
        self.stop = list(dict.fromkeys([*config.stop, *get_registry().get("env", env_id).stop]))
        if not isinstance(env_config, BaseModel):
            env_config = validate_config(self.env_cls.config_class, env_config or {}, "env")
        if config.max_turns is not None:
            env_config = env_config.model_copy(update={"max_turns": config.max_turns})
        self.env_config = env_config
        self._env_pool: RayEnvPool | None = None

    @property
    def env_pool(self) -> RayEnvPool | None:
        """The env workers on Ray (``env_placement=ray``), started on first use; ``None`` for local envs."""
        if self._env_pool is None and self.config.env_placement == "ray":
            from skyrl_core.env_pool import RayEnvPool

            c = self.config
            self._env_pool = RayEnvPool(self.env_cls, self.env_config, envs_per_worker=c.envs_per_worker,
                                        max_workers=c.max_env_workers, resources=c.env_resources,
                                        call_timeout=c.env_call_timeout)
        return self._env_pool

    def close(self) -> None:
        """Release the env workers (``env_placement=ray``); local envs need nothing."""
        if self._env_pool is not None:
            self._env_pool.close()
            self._env_pool = None

    def sampling_params(self, max_tokens: int, seed: int | None = None,
                        session_id: str | None = None) -> SamplingParams:
        c = self.config
        return SamplingParams(max_tokens=max_tokens, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                              stop=self.stop, stop_token_ids=[self.renderer.end_of_turn_id], seed=seed,
                              session_id=session_id)

    @property
    def batch_seed(self) -> int:
        """The seed of the batch being generated (``generate(seed=...)``), else ``config.seed``.

        A context variable, so concurrent ``generate`` calls (and a sub-generator playing episodes
        for this one) each see the seed of their own batch.
        """
        seed = _BATCH_SEED.get()
        return self.config.seed if seed is None else seed

    def episode_key(self, trajectory: Trajectory) -> str:
        """The episode's place in the batch, ``"<group id>/<sample index>"`` (``"<group id>#<k>/<sample
        index>"`` for the ``k``-th repeat of a task in one batch); its request keys extend it."""
        current = _EPISODE_KEY.get()
        if current is not None and current[0] is trajectory:
            return current[1]
        return f"{trajectory.group_id}/{trajectory.sample_index}"

    def request_seed(self, key: str) -> int:
        """:func:`request_seed` of the current batch seed and ``key``."""
        return request_seed(self.batch_seed, key)

    async def generate(self, tasks: Sequence[Mapping[str, Any]], n_samples: int | None = None, *,
                       seed: int | None = None) -> TrajectoryBatch:
        """Run ``n_samples`` (default: config) episodes per task; results keep input order.

        ``seed`` (default: ``config.seed``) seeds the batch's sampling: each engine request gets
        :func:`request_seed` of it and the request's task id, sample and turn, so the same seed gives
        the same requests whatever the concurrency or timing.
        """
        token = _BATCH_SEED.set(self.config.seed if seed is None else seed)
        try:
            return await self._generate(tasks, n_samples)
        finally:
            _BATCH_SEED.reset(token)

    async def _generate(self, tasks: Sequence[Mapping[str, Any]], n_samples: int | None) -> TrajectoryBatch:
        n = n_samples or self.config.n_samples_per_prompt
        _ = self.env_pool  # env_placement=ray: workers placeable (or a ConfigError) before any episode starts
        semaphore = asyncio.Semaphore(self.config.max_concurrency)
        jobs = []
        repeats: dict[str, int] = {}
        for index, task in enumerate(tasks):
            group_id = str(task.get("id", index))
            repeat = repeats[group_id] = repeats.get(group_id, -1) + 1
            place = f"{group_id}#{repeat}" if repeat else group_id
            for sample in range(n):
                jobs.append(self._bounded(semaphore, dict(task), group_id, sample, f"{place}/{sample}"))
        started = time.perf_counter()
        lost_before = self._env_pool.workers_lost if self._env_pool is not None else 0
        played = await asyncio.gather(*jobs)
        episodes = [episode for episode, _ in played]
        dropped = drop_lost_groups(episodes, self.config.max_env_retries)
        trajectories = [t for episode in episodes for t in self.training_samples(episode)]
        batch = TrajectoryBatch(trajectories)
        batch.metrics = rollout_metrics(episodes, time.perf_counter() - started)
        if self._env_pool is not None:
            batch.metrics.update({"ray/episodes_retried": float(sum(retries for _, retries in played)),
                                  "ray/workers_lost": float(self._env_pool.workers_lost - lost_before),
                                  "ray/groups_dropped": float(dropped), **self._env_pool.stats()})
        return batch

    async def _bounded(self, semaphore: asyncio.Semaphore, task: dict[str, Any], group_id: str,
                       sample: int, key: str) -> tuple[Trajectory, int]:
        """One episode and how often it was played again because its env worker was lost."""
        async with semaphore:
            retries = 0
            while True:
                trajectory = Trajectory(group_id=group_id, sample_index=sample, env_id=self.env_id, task=task)
                token = _EPISODE_KEY.set((trajectory, key))
                try:
                    await self.run_episode(trajectory)
                finally:
                    _EPISODE_KEY.reset(token)
                if trajectory.stop_reason != WORKER_LOST or retries == self.config.max_env_retries:
                    break
                retries += 1
        get_plugin_manager().hook.on_rollout_end(trajectory=trajectory)
        return trajectory, retries

    def new_env(self, task: Mapping[str, Any]) -> EpisodeEnv:
        """A local env for ``task``, or (``env_placement=ray``) its stand-in on an env worker."""
        pool = self.env_pool
        if pool is not None:
            return RemoteEnv(pool, task)
        return self.env_cls(task=task, config=self.env_config)

    async def run_episode(self, trajectory: Trajectory) -> Trajectory:
        """Fill ``trajectory`` by playing one episode; never raises."""
        started = time.perf_counter()
        env: EpisodeEnv | None = None
        try:
            env = self.new_env(trajectory.task)
            seed = self.config.seed + trajectory.sample_index
            messages, info = await env.areset(seed=seed, options={"task": trajectory.task})
            trajectory.messages = list(messages)
            trajectory.reward_ceiling = _ceiling(info)
            await self._play(env, trajectory)
        except EpisodeStop as stop:
            trajectory.stop_reason = stop.stop_reason
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this episode
            trajectory.error = f"{type(exc).__name__}: {exc}"
            trajectory.stop_reason = getattr(exc, "stop_reason", "error")
            if trajectory.stop_reason == WORKER_LOST:
                log.warning("episode %s (task %s): %s", trajectory.id, trajectory.group_id, exc)
            else:
                log.warning("episode %s (task %s) failed: %s\n%s", trajectory.id, trajectory.group_id,
                            trajectory.error, traceback.format_exc())
        finally:
            if env is not None:
                trajectory.env_node = env.node_id
                trajectory.metrics.update(await env.afinish())
        trajectory.reward = sum(t.reward for t in trajectory.turns)
        trajectory.metrics.setdefault("episode_seconds", time.perf_counter() - started)
        return trajectory

    async def _play(self, env: EpisodeEnv, traj: Trajectory) -> None:
        c = self.config
        traj.prompt_ids = self.renderer.prompt_ids(traj.messages)
        if len(traj.prompt_ids) >= c.max_context_length:
            traj.stop_reason = "prompt_too_long"
            traj.error = f"prompt has {len(traj.prompt_ids)} tokens; max_context_length is {c.max_context_length}"
            traj.prompt_ids = []  # nothing from this episode may reach training
            return
        generated = 0
        key = self.episode_key(traj)
        while True:
            context = len(traj.prompt_ids) + len(traj.response_ids)
            budget = min(c.max_tokens_per_turn, c.max_context_length - context, c.max_total_tokens - generated)
            if budget <= 0:
                traj.stop_reason = "token_budget" if generated >= c.max_total_tokens else "context_length"
                return
            params = self.sampling_params(budget, seed=self.request_seed(f"{key}/t{len(traj.turns)}"), session_id=key)
            out = await self.engine.generate(traj.prompt_ids + traj.response_ids, params)
            ids = list(out.token_ids[:budget])
            logprobs = list(out.logprobs[: len(ids)]) if out.logprobs is not None else [0.0] * len(ids)
            generated += len(ids)
            traj.response_ids += ids
            traj.loss_mask += [1] * len(ids)
            traj.logprobs += logprobs
            traj.policy_versions += _token_versions(out, len(ids))
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            step = await env.astep(text)
            traj.messages.append({"role": "assistant", "content": text})
            turn = Turn(action=text, observation=step.observation, reward=step.reward, info=step.info,
                        generated_tokens=len(ids), engine_stop_reason=out.stop_reason,
                        token_source=out.metadata.get("token_source", "exact"))
            traj.turns.append(turn)
            if step.info.get("error"):
                traj.error = str(step.info["error"])
            if step.terminated or step.truncated:
                traj.stop_reason = _end_reason(step.terminated, step.info)
                return
            ended = bool(ids) and ids[-1] == self.renderer.end_of_turn_id
            obs_ids = self.renderer.observation_ids(step.observation, ended)
            if len(traj.prompt_ids) + len(traj.response_ids) + len(obs_ids) >= c.max_context_length:
                traj.stop_reason = "context_length"
                return
            traj.messages.extend(step.observation)
            turn.observation_tokens = len(obs_ids)
            traj.response_ids += obs_ids
            traj.loss_mask += [0] * len(obs_ids)
            traj.logprobs += [0.0] * len(obs_ids)
            traj.policy_versions += [-1] * len(obs_ids)

    def training_samples(self, episode: Trajectory) -> list[Trajectory]:
        """The episode itself, or one sample per turn in step-wise mode."""
        if not self.config.step_wise or not episode.turns:
            return [episode]
        return split_into_steps(episode)


def split_into_steps(episode: Trajectory) -> list[Trajectory]:
    """One sample per turn: the context so far as prompt, that turn's generated ids as response.

    Every step carries the episode's total reward, so outcome-based advantages computed on the
    last step apply to all of its steps.
    """
    steps = []
    position = 0
    for index, turn in enumerate(episode.turns):
        start, end = position, position + turn.generated_tokens
        steps.append(Trajectory(
            prompt_ids=episode.prompt_ids + episode.response_ids[:start],
            response_ids=episode.response_ids[start:end], loss_mask=episode.loss_mask[start:end],
            logprobs=episode.logprobs[start:end], policy_versions=episode.policy_versions[start:end],
            reward=episode.reward, turns=[turn],
            stop_reason=episode.stop_reason, id=f"{episode.id}-s{index}", parent_id=episode.parent_id,
            depth=episode.depth, group_id=episode.group_id, sample_index=episode.sample_index,
            env_id=episode.env_id, task=episode.task, step_index=index,
            is_last_step=index == len(episode.turns) - 1, error=episode.error, metrics=episode.metrics,
            env_node=episode.env_node))
        position = end + turn.observation_tokens
    return steps


def _token_versions(out: GenerateOutput, n: int) -> list[int]:
    """The policy version of each of the first ``n`` ids of ``out``: its ``weight_versions``, else
    ``metadata["weight_version"]`` for all, else -1 (unknown)."""
    versions = getattr(out, "weight_versions", None)
    if versions is not None and len(versions) >= n:
        return [int(v) for v in versions[:n]]
    version = out.metadata.get("weight_version")
    return [int(version) if version is not None else -1] * n


def _ceiling(info: Mapping[str, Any]) -> float | None:
    ceiling = info.get("reward_ceiling") if isinstance(info, Mapping) else None
    return float(ceiling) if isinstance(ceiling, int | float) and not isinstance(ceiling, bool) else None


def _end_reason(terminated: bool, info: Mapping[str, Any]) -> str:
    if info.get("error"):
        return "env_error"
    return "terminated" if terminated else "truncated"


def drop_lost_groups(episodes: Sequence[Trajectory], max_retries: int) -> int:
    """Mark every episode of a group one of whose episodes lost its env worker on its last try as failed
    (a group missing a sample would skew its advantages); returns how many groups were dropped."""
    lost = {t.group_id for t in episodes if t.stop_reason == WORKER_LOST}
    for t in episodes:
        if t.group_id in lost and t.stop_reason != WORKER_LOST:
            t.error = (f"group dropped: an episode of task {t.group_id!r} lost its env worker "
                       f"{max_retries + 1} time(s) (generator.max_env_retries={max_retries})")
    return len(lost)


def mean_env_metrics(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """``env/<name>``: the mean over episodes of each per-episode metric (from ``env.get_metrics()``)."""
    values: dict[str, list[float]] = {}
    for episode in episodes:
        for key, value in episode.metrics.items():
            values.setdefault(f"env/{key}", []).append(value)
    return {key: sum(v) / len(v) for key, v in values.items()}


def rollout_metrics(episodes: Sequence[Trajectory], seconds: float) -> dict[str, float]:
    """Batch-level summary: env metric means, reward mean/std, turns, generated tokens, errors, throughput.

    A chat-mode batch (an episode with ``token_source == "text"``) has no model tokens: its length and
    speed are counted in characters of the replies, as ``rollout/response_chars_mean`` and
    ``rollout/generated_chars_per_second``, never under the token names.
    """
    if not episodes:
        return {}
    rewards = [t.reward for t in episodes]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    chat = any(t.token_source == "text" for t in episodes)  # one engine a batch: an episode with no turn is alike
    metrics = {
        **mean_env_metrics(episodes),
        "reward/mean": mean, "reward/std": std, "reward/max": max(rewards), "reward/min": min(rewards),
        "rollout/turns_mean": sum(len(t.turns) for t in episodes) / len(episodes),
        "rollout/errors": float(sum(t.error is not None for t in episodes)),
        "rollout/episodes": float(len(episodes)),
        "rollout/seconds": seconds,
    }
    if chat:
        chars = sum(len(turn.action) for t in episodes for turn in t.turns)
        metrics["rollout/response_chars_mean"] = chars / len(episodes)
        metrics["rollout/generated_chars_per_second"] = chars / seconds if seconds > 0 else 0.0
    else:
        generated = sum(sum(t.loss_mask) for t in episodes)
        metrics["rollout/response_tokens_mean"] = generated / len(episodes)
        metrics["rollout/generated_tokens_per_second"] = generated / seconds if seconds > 0 else 0.0
    return metrics
