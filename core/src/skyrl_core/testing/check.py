"""``check_env``: the conformance checker every shipped env passes, in the spirit of Gymnasium's.

It plays short episodes and checks: the Gymnasium return shapes and types; that empty, garbage,
huge and unclosed-tag actions get an observation instead of an exception or an infrastructure
error, and that an empty action at the last turn (answered by ``TextEnv.reject_action``) still
ends the episode within the reward range; that multi-turn episodes (hostile actions turn after
turn, a wrong answer then the gold ones, a near miss then the gold ones) keep their summed reward
inside ``reward_range`` after every turn, as the generator sums it; that the turn limit
truncates; that a seed makes episodes repeat exactly; that each row's prompt builds and the env's
``gold_actions()`` reach the top of its reward range (one check a row, ``prompt[row N]`` and
``gold[row N] (task-name)`` with ``N`` the 1-based row number used by every message about a dataset
row, the latter played by :func:`skyrl_core.oracle.play_gold`); that a fresh
env pickles (remote workers); that the async ``astep`` agrees with ``step``; that ``close()`` can
be called twice; and that Gymnasium's own ``check_env`` passes without warnings. Warnings that loading
the env's dataset raises (``UserWarning`` and its subclasses, e.g. a task file the env's loader
flags) are kept in the report, never failing it.
"""

from __future__ import annotations

import asyncio
import pickle
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from skyrl_core.env import EnvConfig, TextEnv
from skyrl_core.factory import env_class, validate_config
from skyrl_core.oracle import play_gold, row_name
from skyrl_core.registry import did_you_mean
from skyrl_core.testing.adversarial import near_miss

HOSTILE_ACTIONS: dict[str, str] = {
    "empty": "",
    "whitespace": " \n\t ",
    "garbage": "\x00\x01\ufffd\udcff" + "".join(chr(c) for c in range(0x2500, 0x2540)),
    "unclosed_answer": "<answer>unterminated",
    "unclosed_code": "```repl\nprint('never closed'",
    "unclosed_sql": "<sql>SELECT * FROM",
    "unclosed_solution": "<solution>SELECT",
    "nested_tags": "<answer><answer></answer>",
    "markup_soup": "</solution></sql>``` FINAL( FINAL_VAR( <search></search>",
}


WRONG_ANSWER = "I am not sure."

EPISODES: dict[str, Callable[[list[str], int], list[str] | None]] = {
    "hostile": lambda gold, turns: list(HOSTILE_ACTIONS.values()),
    "wrong_then_gold": lambda gold, turns: [WRONG_ANSWER, *gold] if gold else None,
    "near_miss_then_gold": lambda gold, turns: [_near_miss(gold[0]), *gold] if gold else None,
    "formatted_wrong_then_gold": lambda gold, turns: (
        [near_miss(gold[-1])] * max(turns - len(gold), 1) + gold if gold else None),
}
"""Multi-turn action sequences built from the task's gold actions (``[]`` when it has none) and its turn
limit; ``None`` when the sequence needs gold actions the task does not have. ``formatted_wrong_then_gold``
plays a wrong answer in the env's own format (the last gold action made wrong) on every turn but the
last ones, then the gold: a format reward paid per turn shows as a total outside the range."""

SKIPPABLE = ("spec", "pickle", "turn_limit", "determinism", "astep", "gymnasium", "action", "episode", "prompt", "gold")
"""Check families ``check_env(skip=...)`` accepts: a family skips all its checks (``"gold"``:
every ``gold[row N]``), a full id one check (``"action:huge"``, ``"gold[row 3]"``)."""


class EnvCheckError(AssertionError):
    """The env broke the contract; the message lists every failed check."""


@dataclass
class EnvCheckReport:
    """Check ids that passed or were skipped, ``"<label>: <problem>"`` for each failure, and the warnings
    raised while loading the env's dataset (they never fail the check).

    Ids are stable (``gold[row 3]``: row numbers are 1-based, as in every message about a dataset
    row); :meth:`label` adds the task's name where the row has one (``gold[row 3] (builtin-2)``), as
    the CLI prints them. :attr:`bad_rows` names the rows whose prompt or gold check failed.
    """

    env: str
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    bad_rows: list[str] = field(default_factory=list)

    def label(self, check: str) -> str:
        return self.labels.get(check, check)


def check_env(env: str | type[TextEnv], *, tasks: Sequence[Mapping[str, Any]] | None = None,
              config: EnvConfig | Mapping[str, Any] | None = None, n_tasks: int = 2, seed: int = 0,
              skip: Collection[str] = (), raise_on_failure: bool = True) -> EnvCheckReport:
    """Check an env (registered id or class) against the TextEnv contract.

    ``tasks`` default to the first ``n_tasks`` rows of the env's built-in dataset (``0``: all of
    them). Row ``N`` (1-based) gets the checks ``prompt[row N]`` (its prompt builds into messages)
    and ``gold[row N]`` (its gold actions reach the top of ``reward_range``), labelled
    ``gold[row N] (name)`` when the row has a ``name``, ``id`` or ``task_id``. Every row's prompt is
    checked first: the other checks play the first row whose prompt builds (they are skipped when
    none does), and a row whose prompt fails gets no gold episode (its ``gold`` check is skipped).
    ``report.bad_rows`` lists the failing rows, ``row N (name)``.

    ``skip`` names checks that cannot hold for this env, reported as skipped: a family from
    :data:`SKIPPABLE` or one check id. An env scored by a sampling LLM judge cannot repeat an
    episode exactly, so it passes ``skip={"determinism"}`` (Gymnasium's checker then treats it as
    ``nondeterministic`` too, and ``astep`` is compared with ``step`` by shape only).
    """
    unknown = sorted(name for name in skip if check_family(name) not in SKIPPABLE)
    if unknown:
        raise ValueError(f"unknown check {unknown[0]!r} in skip.{did_you_mean(unknown[0], list(SKIPPABLE))} "
                         f"Checks: {', '.join(SKIPPABLE)}")
    cls = env_class(env) if isinstance(env, str) else env
    if not isinstance(config, EnvConfig):
        config = validate_config(cls.config_class, config or {}, "env")
    if n_tasks < 0:
        raise ValueError(f"n_tasks must be 0 (all rows) or more, got {n_tasks}")
    report = EnvCheckReport(env if isinstance(env, str) else cls.__name__)
    if tasks is None:
        rows = _dataset_rows(cls, config, report)
        tasks = rows[:n_tasks] if n_tasks else rows
    if not tasks:
        raise EnvCheckError(f"{cls.__name__}: no tasks to check with (pass tasks=...)")
    deterministic = "determinism" not in skip

    def run(name: str, check: Callable[[], str | None]) -> bool:
        """Run one check into the report; False when it failed."""
        if name in skip or check_family(name) in skip:
            report.skipped.append(name)
            return True
        try:
            outcome = check()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, not just the first
            report.failed.append(f"{report.label(name)}: raised {type(exc).__name__}: {exc}")
            return False
        if outcome == "skip":
            report.skipped.append(name)
        elif outcome:
            report.failed.append(f"{report.label(name)}: {outcome}")
            return False
        else:
            report.passed.append(name)
        return True

    if isinstance(env, str):
        run("spec", lambda: _check_spec(env, cls))
    rows_ok: list[bool] = []
    for number, task in enumerate(tasks, start=1):  # up front: a bad row is named before any episode
        name = row_name(task)
        for check_id in (f"prompt[row {number}]", f"gold[row {number}]"):
            if name is not None:
                report.labels[check_id] = f"{check_id} ({name})"
        rows_ok.append(run(f"prompt[row {number}]", lambda t=task: _check_prompt(cls, config, t, seed)))
    first = tasks[rows_ok.index(True)] if any(rows_ok) else None
    checks: list[tuple[str, Callable[[], str | None]]] = [
        ("pickle", lambda: _check_pickle(cls, config, first)),
        ("turn_limit", lambda: _check_turn_limit(cls, config, first, seed)),
        ("determinism", lambda: _check_determinism(cls, config, first, seed)),
        ("astep", lambda: _check_astep(cls, config, first, seed, deterministic)),
        ("gymnasium", lambda: _check_gymnasium(cls, config, first, deterministic)),
    ]
    for name in HOSTILE_ACTIONS:
        checks.append((f"action:{name}", lambda n=name: _check_action(cls, config, first, seed, HOSTILE_ACTIONS[n])))
    checks.append(("action:huge", lambda: _check_action(cls, config, first, seed, "x" * (config.max_action_chars + 1))))
    checks.append(("action:empty_at_turn_limit", lambda: _check_action(cls, config, first, seed, "", turn=None)))
    for name, sequence in EPISODES.items():
        checks.append((f"episode:{name}", lambda s=sequence: _check_episode(cls, config, first, seed, s)))
    for name, check in checks:
        if first is None:  # no row's prompt builds: nothing to play the episode checks on
            report.skipped.append(name)
        else:
            run(name, check)
    for number, (task, ok) in enumerate(zip(tasks, rows_ok, strict=True), start=1):
        if not ok:
            report.skipped.append(f"gold[row {number}]")
        elif not run(f"gold[row {number}]", lambda t=task: _check_gold(cls, config, t, seed)):
            rows_ok[number - 1] = False
    report.bad_rows = [f"row {number}" + (f" ({row_name(task)})" if row_name(task) is not None else "")
                       for number, (task, ok) in enumerate(zip(tasks, rows_ok, strict=True), start=1) if not ok]
    if report.failed and raise_on_failure:
        raise EnvCheckError(f"{report.env} failed {len(report.failed)} check(s):\n  " + "\n  ".join(report.failed))
    return report


def _dataset_rows(cls: type[TextEnv], config: EnvConfig, report: EnvCheckReport) -> list[Mapping[str, Any]]:
    """The env's train rows; the ``UserWarning``s that loading them raises go to ``report.warnings``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = list(cls.load_dataset("train", config))
    for warning in caught:
        if not issubclass(warning.category, UserWarning):  # a library's: shown as it would have been
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        elif str(warning.message) not in report.warnings:
            report.warnings.append(str(warning.message))
    return rows


def check_family(check: str) -> str:
    """``"action:huge"`` -> ``"action"``, ``"gold[row 3]"`` -> ``"gold"``."""
    return check.split(":")[0].split("[")[0]


class _Episode:
    """An env built and reset for one check; closed on exit."""

    def __init__(self, cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int) -> None:
        self.env = cls(task=task, config=config)
        self.seed = seed

    def __enter__(self) -> tuple[TextEnv, Any]:
        return self.env, self.env.reset(seed=self.seed, options={"task": dict(self.env.task)})

    def __exit__(self, *exc: object) -> None:
        self.env.close()


def _shape_problem(result: Any) -> str | None:
    if not (isinstance(result, tuple) and len(result) == 5):
        return f"step() must return (observation, reward, terminated, truncated, info), got {result!r:.200}"
    obs, reward, terminated, truncated, info = result
    problem = _messages_problem(obs, "observation")
    if problem:
        return problem
    if not isinstance(reward, float):
        return f"reward must be a float, got {type(reward).__name__}"
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        return "terminated and truncated must be bools"
    if not isinstance(info, dict):
        return f"info must be a dict, got {type(info).__name__}"
    return None


def _messages_problem(messages: Any, what: str) -> str | None:
    if not isinstance(messages, list):
        return f"{what} must be a list of messages, got {type(messages).__name__}"
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return f"{what} holds {m!r:.120}; each message must be {{'role': str, 'content': str}}"
    return None


def _check_pickle(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any]) -> str | None:
    env = cls(task=task, config=config)
    clone = pickle.loads(pickle.dumps(env))
    if clone.config != env.config or clone.task != env.task:
        return "a pickled env does not keep its config and task"
    return None


def _check_spec(env_id: str, cls: type[TextEnv]) -> str | None:
    """The registered EnvSpec's ``reward_range`` and ``max_turns`` agree with the class under its default config
    (they are what `skyrl envs` shows and what a run plans with, so a spec that disagrees misleads silently)."""
    from skyrl_core.plugins import get_registry

    spec = get_registry().get("env", env_id)
    try:
        default = cls.config_class()
    except ValueError:
        return "skip"  # a required option (e.g. which catalogue env): no default config to compare with
    problems = []
    declared, actual = tuple(spec.reward_range), tuple(cls.reward_range_for(default))  # type: ignore[attr-defined]
    if declared != actual:
        problems.append(f"EnvSpec.reward_range is {declared} but {cls.__name__} gives {actual}")
    max_turns = spec.max_turns  # type: ignore[attr-defined]
    if max_turns is not None and max_turns != default.max_turns:
        problems.append(f"EnvSpec.max_turns is {max_turns} but {cls.__name__}'s default config has max_turns="
                        f"{default.max_turns}")
    return "; ".join(problems) or None


def _check_action(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int, action: str,
                  turn: int | None = 1) -> str | None:
    """Play ``action`` as turn number ``turn`` (``None``: the task's last turn; earlier turns are :data:`WRONG_ANSWER`)."""
    with _Episode(cls, config, task, seed) as (env, (obs, info)):
        problem = _messages_problem(obs, "reset() observation") or (None if isinstance(info, dict) else "reset() info must be a dict")
        if problem:
            return problem
        turn = env.max_turns if turn is None else turn
        _play(env, [WRONG_ANSWER] * (turn - 1))
        if env.done:
            return "skip"  # the episode ended before the turn under test
        result = env.step(action)
        problem = _shape_problem(result)
        if problem:
            return problem
        if result.info.get("error"):
            return f"a bad action must get an observation, not an infrastructure error: {result.info['error']}"
        if not result.observation and not (result.terminated or result.truncated):
            return "a bad action got no observation, so the model is not told what was wrong"
        if turn >= env.max_turns and not (result.terminated or result.truncated):
            return f"the episode did not end at the turn limit ({env.max_turns})"
        low, high = env.reward_range
        if not low <= env.episode_reward <= high:
            return f"the episode's reward {env.episode_reward:g} is outside reward_range {env.reward_range}"
    return None


def _check_turn_limit(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int) -> str | None:
    with _Episode(cls, config, task, seed) as (env, _):
        for _turn in range(env.max_turns):
            result = env.step(WRONG_ANSWER)
            if result.terminated or result.truncated:
                return None
        return f"episode still running after max_turns={env.max_turns} actions; expected truncated=True"


def _play(env: TextEnv, actions: Sequence[str]) -> list[tuple[Any, ...]]:
    out = []
    for action in actions:
        r = env.step(action)
        out.append((r.observation, r.reward, r.terminated, r.truncated))
        if r.terminated or r.truncated:
            break
    return out


def _check_determinism(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int) -> str | None:
    actions = [WRONG_ANSWER, "<answer>maybe</answer>"]
    runs = []
    for _ in range(2):
        with _Episode(cls, config, task, seed) as (env, (obs, _info)):
            runs.append((obs, _play(env, actions)))
    if runs[0] != runs[1]:
        return "the same seed, task and actions gave different observations or rewards"
    return None


def _check_astep(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int,
                 deterministic: bool) -> str | None:
    """``astep`` returns a well-formed step, the same as ``step``'s where the env is deterministic."""
    with _Episode(cls, config, task, seed) as (env, _):
        sync = env.step(WRONG_ANSWER)
    with _Episode(cls, config, task, seed) as (env, _):
        async_result = asyncio.run(env.astep(WRONG_ANSWER))
    problem = _shape_problem(async_result)
    if problem:
        return f"astep: {problem}"
    if deterministic and (sync.observation, sync.reward, sync.terminated, sync.truncated) != async_result[:4]:
        return "astep() and step() disagree on the same action"
    env.close()  # a second close must be harmless
    return None


def _check_prompt(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int) -> str | None:
    with _Episode(cls, config, task, seed) as (env, (obs, _info)):
        if obs not in env.observation_space:
            return _messages_problem(obs, "the prompt") or "the prompt is not in the observation space"
        if not obs:
            return "the prompt has no messages"
    return None


def _near_miss(action: str) -> str:
    """``action`` with its middle character changed: an answer that is almost right."""
    middle = len(action) // 2
    return action[:middle] + ("y" if action[middle:middle + 1] == "x" else "x") + action[middle + 1:]


def _check_episode(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int,
                   sequence: Callable[[list[str], int], list[str] | None]) -> str | None:
    """Play the sequence until the episode ends; the summed reward stays in range after every turn."""
    with _Episode(cls, config, task, seed) as (env, _):
        low, high = env.reward_range
        actions = sequence(list(env.gold_actions() or []), env.max_turns)
        if actions is None:
            return "skip"
        total = 0.0
        for turn, action in enumerate(actions, start=1):
            result = env.step(action)
            if result.info.get("error"):
                return f"turn {turn} ended in an infrastructure error: {result.info['error']}"
            total += result.reward
            if not low - 1e-9 <= total <= high + 1e-9:
                return (f"the episode's summed reward is {total:g} after turn {turn}, outside reward_range "
                        f"{env.reward_range} (the generator sums turn rewards; pay the episode's reward once)")
            if result.terminated or result.truncated:
                break
    return None


def _check_gymnasium(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], deterministic: bool) -> str | None:
    """Gymnasium's ``check_env`` on the env; its errors and its warnings are problems."""
    env = cls(task=task, config=config)
    env.spec = EnvSpec(id=f"skyrl/{cls.__name__}", entry_point=cls, kwargs={"task": dict(task), "config": config},
                       nondeterministic=not deterministic)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env)
    except AssertionError as exc:
        return f"gymnasium's check_env: {exc}"
    finally:
        env.close()
    if caught:
        return "gymnasium's check_env warned: " + "; ".join(str(w.message) for w in caught)
    return None


def _check_gold(cls: type[TextEnv], config: EnvConfig, task: Mapping[str, Any], seed: int) -> str | None:
    (result,) = asyncio.run(play_gold(cls, config, [task], concurrency=1, seed=seed))
    return "skip" if result.no_gold else result.problem(cls.reward_range_for(config))
