"""Oracle episodes: play an env's own ``gold_actions()`` instead of a model.

``skyrl rollout --oracle`` and the ``gold[row N]`` checks of ``skyrl check`` both run on
:func:`play_gold`. An oracle episode that does not reach the top of the env's ``reward_range`` (or
has no gold actions, or fails) points at a broken task or a broken env, not at a weak model;
:meth:`OracleResult.problem` says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from skyrl_core.env import EnvConfig, TextEnv
from skyrl_core.factory import validate_config

REPORT_KEY = "report"
"""The ``info`` key whose ``{column: text}`` mapping an oracle episode keeps (``skyrl check --dataset``'s columns)."""
NAME_FIELDS = ("name", "id", "task_id")
"""Row fields that name a task, in order of preference."""


def row_name(row: Mapping[str, Any]) -> str | None:
    """The row's own name: its ``name``, else ``id``, else ``task_id`` (``None`` when it has none)."""
    for key in NAME_FIELDS:
        value = row.get(key)
        if value is not None and str(value) != "":
            return str(value)
    return None


def task_name(row: Mapping[str, Any], index: int) -> str:
    """The row's name (:func:`row_name`), else ``row <index + 1>``: rows are numbered from 1 in every
    message about a dataset (file errors, ``skyrl check``, the oracle's tables), so one row has one number."""
    return row_name(row) or f"row {index + 1}"


@dataclass
class OracleResult:
    """One oracle episode. ``reward`` is the sum over turns; ``error`` is the env's ``info["error"]``
    or the text of an exception raised while making, resetting or playing the env."""

    task_name: str
    index: int
    reward: float = 0.0
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    no_gold: bool = False
    ceiling: float | None = None  # the env's reward_ceiling() for this task, read after reset
    report: dict[str, str] = field(default_factory=dict)  # the env's info["report"] columns (skyrl check --dataset)

    @property
    def end(self) -> str:
        """How the episode ended: ``error``, ``no gold``, ``terminated``, ``truncated`` or ``unfinished``."""
        if self.error:
            return "error"
        if self.no_gold:
            return "no gold"
        if self.terminated:
            return "terminated"
        return "truncated" if self.truncated else "unfinished"

    def target(self, reward_range: tuple[float, float]) -> float:
        """The reward the gold actions must reach: the task's ceiling, else the top of ``reward_range``."""
        return self.ceiling if self.ceiling is not None else reward_range[1]

    def problem(self, reward_range: tuple[float, float]) -> str | None:
        """Why this episode does not prove the task solvable (``None`` when it does): an error, no
        gold actions, an episode the gold actions did not terminate, or a reward other than the task's
        ceiling (the top of ``reward_range`` unless the env declares a lower one for the task; below it:
        the task is not solved; above it: the env breaks its range)."""
        top = self.target(reward_range)
        if top > reward_range[1] + 1e-9:
            return f"the env declares a ceiling of {top:g} for this task, above the top of reward_range {reward_range[1]:g}"
        if self.error:
            return f"error: {self.error}"
        if self.no_gold:
            return "the env has no gold actions for this task"
        if not self.terminated:
            return (f"the gold actions did not terminate the episode "
                    f"({self.end} after {self.turns} turn(s), reward {self.reward:g})")
        if abs(self.reward - top) > 1e-6:
            expected = "the top of reward_range" if self.ceiling is None else "the task's reward_ceiling()"
            return f"the gold actions scored {self.reward:g}, expected {expected} {top:g}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def play_gold(env_cls: type[TextEnv], config: EnvConfig | Mapping[str, Any] | None,
                    rows: Sequence[Mapping[str, Any]], *, concurrency: int = 4, seed: int = 0,
                    on_result: Callable[[OracleResult], None] | None = None) -> list[OracleResult]:
    """Play each row's gold actions in a fresh env; one :class:`OracleResult` per row, in row order.

    Each episode makes ``env_cls(task=row, config=config)``, resets it with ``seed`` and
    ``options={"task": row}``, plays ``gold_actions()`` through ``astep`` (so sync and async envs
    alike) until the episode ends or the actions run out, reads ``get_metrics()`` and always closes
    the env. At most ``concurrency`` episodes run at once. An exception is recorded in that row's
    result and never stops the others. ``on_result`` is called as each episode finishes (e.g. to
    advance a progress bar).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if not isinstance(config, EnvConfig):
        config = validate_config(env_cls.config_class, config or {}, "env")
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded(index: int, row: Mapping[str, Any]) -> OracleResult:
        async with semaphore:
            result = await _episode(env_cls, config, dict(row), index, seed)
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(bounded(i, row) for i, row in enumerate(rows))))


async def _episode(env_cls: type[TextEnv], config: EnvConfig, row: dict[str, Any], index: int,
                   seed: int) -> OracleResult:
    result = OracleResult(task_name(row, index), index)
    env: TextEnv | None = None
    try:
        env = env_cls(task=row, config=config)
        await env.areset(seed=seed, options={"task": row})
        ceiling = float(env.reward_ceiling())
        result.ceiling = None if abs(ceiling - env.reward_range[1]) <= 1e-9 else ceiling
        gold = env.gold_actions()
        if gold is None:
            result.no_gold = True
            return result
        for action in gold:
            step = await env.astep(action)
            result.turns += 1
            result.reward += float(step.reward)
            if step.info.get("error"):
                result.error = str(step.info["error"])
            if isinstance(step.info.get(REPORT_KEY), Mapping):
                result.report.update({str(key): str(value) for key, value in step.info[REPORT_KEY].items()})
            if step.terminated or step.truncated:
                result.terminated, result.truncated = bool(step.terminated), bool(step.truncated)
                break
    except Exception as exc:  # noqa: BLE001 - one broken task never stops the others
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            result.metrics = await env.afinish()
    return result
