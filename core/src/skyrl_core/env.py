"""``TextEnv``: a Gymnasium environment whose actions are model text and observations are messages.

Subclasses implement :meth:`TextEnv.build_prompt` (the opening messages for the current task) and
:meth:`TextEnv.take_action` (or the coroutine :meth:`TextEnv.atake_action` for envs that await I/O).
The base class keeps the Gymnasium contract around them: turn counting, turn-limit truncation,
rejection of non-text/empty/huge actions (answered by :meth:`TextEnv.reject_action`, which an env
overrides to score them like its other malformed turns), and turning an exception inside the env
into ``truncated=True`` with ``info["error"]`` instead of a crash. Its spaces (:class:`AnyText`
actions bounded by ``max_action_chars``, :class:`Messages` observations) let Gymnasium's own
``check_env`` pass on it. The whole contract is in :class:`TextEnv`'s docstring and in
docs/packages/core.md ("The env contract").
"""

from __future__ import annotations

import asyncio
import logging
import math
import string
import threading
import traceback
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

import gymnasium
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, field_validator

Message = dict[str, str]
T = TypeVar("T")
log = logging.getLogger(__name__)

#: Longest message content the observation space admits: about 250k tokens, past any model's context.
MAX_MESSAGE_CHARS = 1_000_000


class AnyText(spaces.Text):
    """``spaces.Text`` that holds any Unicode string within its length bounds.

    Model replies and tool output use every character, so membership checks only the length;
    :meth:`sample` draws printable ASCII (letters, digits, punctuation, space, newline).
    """

    def __init__(self, max_length: int, *, min_length: int = 0) -> None:
        super().__init__(max_length, min_length=min_length,
                         charset=string.ascii_letters + string.digits + string.punctuation + " \n")

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class Messages(spaces.Sequence):
    """A list of chat messages ``{"role": str, "content": str}``: the observation space of a TextEnv.

    Gymnasium's ``Sequence`` holds tuples; observations are lists (they are appended to the
    conversation), so this one holds lists and samples lists.
    """

    def __init__(self, max_content_chars: int = MAX_MESSAGE_CHARS) -> None:
        super().__init__(spaces.Dict({"role": AnyText(64, min_length=1), "content": AnyText(max_content_chars)}))

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(self.feature_space.contains(m) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        return list(super().sample(mask=mask, probability=probability))


class StepResult(NamedTuple):
    """Gymnasium's 5-tuple: ``obs, reward, terminated, truncated, info = env.step(action)``."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class EpisodeEnv(Protocol):
    """What a generator plays one episode through: a :class:`TextEnv` in its own process, or a
    :class:`~skyrl_core.env_pool.RemoteEnv` standing in for one on a Ray env worker.

    One episode is ``areset`` once, ``astep`` until it ends, then ``afinish`` once, whatever happened.
    """

    @property
    def node_id(self) -> str | None:
        """The Ray node the env runs on when that is an env worker's (``Trajectory.env_node``); ``None`` here."""
        ...

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]: ...

    async def astep(self, action: str) -> StepResult: ...

    async def afinish(self) -> dict[str, float]:
        """The episode's metrics (``get_metrics()`` as floats), then close the env; never raises."""
        ...


class EnvConfig(BaseModel):
    """Options every text env accepts; env plugins subclass this for their own fields."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(1, ge=1, description="Episode is truncated after this many actions.")
    max_action_chars: int = Field(50_000, ge=1, description="Longer actions are rejected unread.")
    reward_range: tuple[float, float] | None = Field(
        None, description="The lowest and highest episode reward, [low, high]; default: the env's own "
                          "(its class's reward_range, or what a bridge reads from the peer env).")

    @field_validator("reward_range")
    @classmethod
    def _ordered(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not (math.isfinite(value[0]) and math.isfinite(value[1]) and value[0] < value[1]):
            raise ValueError(f"must be two finite numbers [low, high] with low < high, got {list(value)}")
        return value


class TextEnv(gymnasium.Env):
    """Base class for multi-turn text environments.

    ``task`` is one dataset row (prompt fields plus gold answers); it can also arrive through
    ``reset(options={"task": row})``. ``config`` is an instance (or dict) of :attr:`config_class`.

    The contract core relies on:

    - **Episode reward is the sum of the turn rewards** (the generator, the oracle and
      ``check_env`` all sum them). The sum must stay inside :attr:`reward_range` for every
      sequence of actions, and the gold actions must reach its top. An env that wants another rule
      (the best try, the last answer only) keeps turn rewards at 0 and pays the episode's reward
      on the turn that ends it.
    - **Per-episode state lives on the instance and is cleared by** :meth:`reset`. Core makes one
      env per episode, resets it once and closes it; Gymnasium users may reset one env many times,
      so an env that keeps counters overrides ``reset`` to clear them and calls ``super().reset``.
      Resources (sandboxes, connections) are released by ``close()``, which may be called twice.
    - :meth:`load_dataset` returns the built-in rows of a split, each one a ``task``;
      :meth:`gold_actions` the actions that solve the current task at full reward (``skyrl check``,
      ``skyrl rollout --oracle``); :meth:`get_metrics` per-episode numbers, read once after the
      episode ends (logged as ``env/<name>`` means).
    - ``info`` keys core reads: ``"error"`` (an infrastructure failure: the episode ends with
      ``truncated=True``, the trajectory is marked failed and is never trained on). Keys the base
      class sets: ``"truncated_reason"`` (the turn limit), ``"invalid_action"`` (the default
      :meth:`reject_action`), ``"traceback"`` (with ``"error"``), ``"max_turns"`` (in ``reset``'s
      info). ``"report"``, a flat ``{column: text}`` mapping, adds columns to ``skyrl check --dataset``'s
      table. All of ``info`` is kept in each trajectory turn, so other keys are free for the env.
    """

    config_class: ClassVar[type[EnvConfig]] = EnvConfig
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    dataset_option: ClassVar[str | None] = None
    """The config field that names a dataset to read (a path), if the env has one: ``skyrl check ENV --dataset
    PATH`` sets it and reports every task of that dataset."""
    node_id: ClassVar[str | None] = None
    """:class:`EpisodeEnv`'s node: none, a TextEnv runs in the process that plays it."""

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if config is None or isinstance(config, Mapping):
            config = self.config_class(**dict(config or {}))
        self.config = config
        self.action_space: AnyText = AnyText(config.max_action_chars)
        self.observation_space: Messages = Messages()
        self.task: dict[str, Any] = dict(task or {})
        self.reward_range = type(self).reward_range_for(config)
        self.turn = 0
        self.done = False
        self.episode_reward = 0.0

    @classmethod
    def reward_range_for(cls, config: EnvConfig) -> tuple[float, float]:
        """The episode reward range under ``config``: ``config.reward_range`` when set, else the class's.

        One class can host envs of several ranges (a bridge: one per peer env); it overrides this to
        read the range of the env ``config`` names. Every checker and evaluator asks this, never the
        class attribute, and an instance's :attr:`reward_range` is this value.
        """
        return tuple(config.reward_range) if config.reward_range is not None else tuple(cls.reward_range)

    @property
    def max_turns(self) -> int:
        """The turn limit of the current task (default: ``config.max_turns``).

        An env whose tasks have their own limits (a game of N rounds) overrides this; checkers and
        probes read it after ``reset``.
        """
        return self.config.max_turns

    def reward_ceiling(self) -> float:
        """The highest episode reward the current task can reach (default: the top of :attr:`reward_range`).

        A task that cannot reach the top of the range on every deal (a game against a fixed opponent,
        partial credit by construction) returns its own ceiling: the gold check expects the gold
        actions to score exactly this, and pass rates count an episode that reaches it as passed.
        """
        return self.reward_range[1]

    # -- to implement ---------------------------------------------------------------------------

    def build_prompt(self) -> list[Message]:
        """Opening messages for ``self.task``. Default: the row's ``prompt`` field."""
        if _overrides(self, "abuild_prompt"):
            return run_sync(self.abuild_prompt())
        prompt = self.task.get("prompt")
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt:
            return [dict(m) for m in prompt]
        raise ValueError(f"{type(self).__name__}: task has no 'prompt' (a string or a list of messages)")

    async def abuild_prompt(self) -> list[Message]:
        """Async form of :meth:`build_prompt`, for envs whose task setup awaits I/O (most peer libraries are
        async). Override one of the two; :meth:`areset` awaits this one, :meth:`reset` calls the other."""
        if _overrides(self, "build_prompt"):
            return await asyncio.to_thread(self.build_prompt)
        return self.build_prompt()

    def take_action(self, action: str) -> StepResult:
        """Apply one model response. Override this or :meth:`atake_action`."""
        if type(self).atake_action is TextEnv.atake_action:
            raise NotImplementedError(f"{type(self).__name__} must implement take_action or atake_action")
        return run_sync(self.atake_action(action))

    async def atake_action(self, action: str) -> StepResult:
        """Async form of :meth:`take_action`; override in envs that await I/O or sub-calls."""
        return await asyncio.to_thread(self.take_action, action)

    def reject_action(self, problem: str) -> StepResult:
        """Answer an action rejected before :meth:`take_action` saw it (not text, empty, too long).

        ``problem`` says what was wrong, e.g. ``"Your response was empty. Reply with text."``; the
        action itself is not passed on (an over-long one is never read). The default shows
        ``problem`` as the observation with ``info["invalid_action"]`` and reward 0, except on the
        last turn, where it scores the bottom of :attr:`reward_range` (never taking the episode's
        total below it), so an empty reply never dodges a negative penalty for wrong answers. Envs that penalise malformed
        output override this to score it like their other malformed turns.
        Turn counting and turn-limit truncation still apply to the result. It runs on the caller's
        thread, so it must not block on I/O; an env that must await something to score a rejected
        action (a peer's async scorer) overrides :meth:`areject_action` instead.
        """
        if _overrides(self, "areject_action") and not _overrides(self, "reject_action"):
            return run_sync(self.areject_action(problem))
        return self._default_rejection(problem)

    async def areject_action(self, problem: str) -> StepResult:
        """Async form of :meth:`reject_action`, awaited by :meth:`astep`; override one of the two."""
        if _overrides(self, "reject_action"):
            return self.reject_action(problem)
        return self._default_rejection(problem)

    def _default_rejection(self, problem: str) -> StepResult:
        reward = 0.0
        if self.turn >= self.max_turns:  # the last turn scores the bottom, and the total never goes below it
            reward = min(0.0, self.reward_range[0] - min(self.episode_reward, 0.0))
        return StepResult([{"role": "user", "content": problem}], reward, False, False, {"invalid_action": problem})

    def gold_actions(self) -> list[str] | None:
        """Actions that solve the current task, played in order from a fresh reset, or ``None``.

        They must terminate the episode with a summed reward equal to the top of
        :attr:`reward_range` (checked by ``check_env`` and ``skyrl rollout --oracle``).
        """
        return None

    def null_action(self) -> str:
        """The shortest reply that looks valid but answers nothing: the null agent of ``skyrl check --adversarial``.

        Every probe is compared with this agent's reward on the same task, so an env that penalises
        malformed replies returns a well-formed one here (SQL: a query that selects nothing), else a
        policy's first lesson, the format, would look like a reward hack. Default: a reply that says it
        does not know (not an empty one: an empty last reply scores the bottom of the range, see
        :meth:`reject_action`, and the null agent must be the honest agent that answers nothing).
        """
        return "I do not know."

    def get_metrics(self) -> dict[str, float]:
        """Per-episode metrics, read once by the generator after the episode ends (before ``close``).

        Values must convert to ``float``; a rollout logs the mean of each as ``env/<name>``.
        """
        return {}

    @classmethod
    def ray_resources(cls, config: EnvConfig) -> dict[str, float]:
        """Custom Ray resources one env worker of this env needs on its node (``generator.env_placement=ray``).

        E.g. ``{"docker": 1}`` for an env whose sandboxes are containers: its workers are then placed only
        on nodes that advertise ``docker`` (``skyrl node-resources``). Default: none, any node will do.
        """
        return {}

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        """The env's built-in task rows for ``split`` (``"train"``, ``"test"``), if it ships any.

        Each row is one ``task``; a ``name``, ``id`` or ``task_id`` field names it in reports.
        The same split and config must give the same rows (``skyrl check --all-rows`` names failing
        rows by their index and name). A ``UserWarning`` it raises about the data (a task file that
        loads but is suspect) is shown by ``skyrl check`` as a ``WARN`` line that does not fail it.
        """
        raise NotImplementedError(f"{cls.__name__} has no built-in dataset; give data files in the config")

    # -- the Gymnasium contract -----------------------------------------------------------------

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: clear the turn count and return :meth:`build_prompt`'s messages.

        ``options={"task": row}`` switches to another task. Subclasses with per-episode state
        override this (or :meth:`areset`), clear it, and return ``super().reset(seed=seed, options=options)``.
        """
        if _overrides(self, "areset") and not _overrides(self, "reset"):
            return run_sync(self.areset(seed=seed, options=options))
        self._begin_episode(seed, options)
        return self.build_prompt(), self._reset_info()

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Async twin of :meth:`reset`; generators always call this one.

        It awaits :meth:`abuild_prompt`, so an env whose setup awaits I/O needs no thread or event loop
        of its own. An env that overrides the sync :meth:`reset` keeps working: its ``reset`` runs in a
        worker thread. Override one of the two, as with :meth:`take_action` and :meth:`atake_action`.
        """
        if _overrides(self, "reset") and not _overrides(self, "areset"):
            return await asyncio.to_thread(self.reset, seed=seed, options=options)
        self._begin_episode(seed, options)
        return await self.abuild_prompt(), self._reset_info()

    def _reset_info(self) -> dict[str, Any]:
        """``reset``'s info: the task's turn limit, and its ``reward_ceiling`` where that is below the range's top."""
        info: dict[str, Any] = {"max_turns": self.max_turns}
        ceiling = float(self.reward_ceiling())
        if ceiling < self.reward_range[1] - 1e-9:
            info["reward_ceiling"] = ceiling
        return info

    def _begin_episode(self, seed: int | None, options: dict[str, Any] | None) -> None:
        gymnasium.Env.reset(self, seed=seed)
        if options and "task" in options:
            self.task = dict(options["task"])
        self.turn = 0
        self.done = False
        self.episode_reward = 0.0

    def step(self, action: str) -> StepResult:
        problem = self._start_turn(action)
        try:
            result = self.take_action(action) if problem is None else self.reject_action(problem)
        except Exception as exc:  # noqa: BLE001 - an env bug ends this episode, not the batch
            return self._failed(exc)
        return self._after_action(result)

    async def astep(self, action: str) -> StepResult:
        """Async twin of :meth:`step`; generators always call this one."""
        problem = self._start_turn(action)
        try:
            if problem is not None:
                result = await self.areject_action(problem)
            elif type(self).atake_action is TextEnv.atake_action:
                result = await asyncio.to_thread(self.take_action, action)
            else:
                result = await self.atake_action(action)
        except Exception as exc:  # noqa: BLE001
            return self._failed(exc)
        return self._after_action(result)

    def _start_turn(self, action: Any) -> str | None:
        """Count the turn; what is wrong with ``action`` if it must be rejected unread, else ``None``."""
        if self.done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended; call reset()")
        self.turn += 1
        if not isinstance(action, str):
            return f"Your response must be text, got {type(action).__name__}."
        if not action.strip():
            return "Your response was empty. Reply with text."
        if len(action) > self.config.max_action_chars:
            return (f"Your response was {len(action):,} characters; the limit is "
                    f"{self.config.max_action_chars:,}. It was not read.")
        return None

    def _after_action(self, result: StepResult) -> StepResult:
        obs, reward, terminated, truncated, info = result
        if not terminated and self.turn >= self.max_turns:
            truncated = True
            info = {**info, "truncated_reason": f"turn limit ({self.max_turns}) reached"}
        self.done = bool(terminated or truncated)
        self.episode_reward += float(reward)
        return StepResult(list(obs), float(reward), bool(terminated), bool(truncated), info)

    async def afinish(self) -> dict[str, float]:
        """End the episode for a generator (:class:`EpisodeEnv`): :meth:`get_metrics`, then :meth:`close` on a
        worker thread; what either raises is logged, never passed on. Envs override those two, not this."""
        metrics = env_metrics(self)
        await asyncio.to_thread(close_env, self)
        return metrics

    def _failed(self, exc: BaseException) -> StepResult:
        self.done = True
        info = {"error": f"{type(exc).__name__}: {exc}", "traceback": "".join(traceback.format_exception(exc))}
        return StepResult([], 0.0, False, True, info)


def _overrides(env: TextEnv, method: str) -> bool:
    """True when ``env``'s class replaces TextEnv's ``method`` (its sync or async twin then delegates to it)."""
    return getattr(type(env), method) is not getattr(TextEnv, method)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end from sync code: on this thread when no event loop runs here, else on a
    new thread with its own loop (a sync ``step`` called from inside async code must not deadlock it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="skyrl-run-sync")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def env_metrics(env: TextEnv) -> dict[str, float]:
    """``env.get_metrics()`` as floats; ``{}`` (logged) when it raises."""
    try:
        return {k: float(v) for k, v in env.get_metrics().items()}
    except Exception:  # noqa: BLE001
        log.warning("get_metrics() of %s failed", type(env).__name__, exc_info=True)
        return {}


def close_env(env: TextEnv) -> None:
    """``env.close()``; what it raises is logged, never passed on."""
    try:
        env.close()
    except Exception:  # noqa: BLE001
        log.warning("close() of %s failed", type(env).__name__, exc_info=True)
