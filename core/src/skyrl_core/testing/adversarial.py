"""``check_adversarial``: scripted hostile policies against an env, each scored beside a null agent.

An RL policy optimises against the env, so it finds every path to reward that does not go through
solving the task. This checker plays such policies on a sample of tasks through the public env API
and compares each one's episode reward with two references played on the same tasks: the **null
agent** (:meth:`TextEnv.null_action` every turn: an empty reply, or the env's shortest reply in its
format that answers nothing) and the **gold** (the env's own ``gold_actions()``). No probe
is given the task's answer: those built from the gold actions change them so they are wrong. A
probe is **flagged** on a task when

- it scores above the null agent at all (the env's own success metric is shown beside it, but
  never excuses it: that metric is part of what is tested);
- ``step`` raises out of the env (a generator would lose the whole batch);
- its episode ends as an env error (``info["error"]``) where the null agent's does not: the episode
  would be dropped from training, so a policy could learn to escape a low reward that way.

And the env is flagged when its state leaks across episodes: playing the gold actions in one
episode changes the null agent's reward in a later episode on the same env and task.

Generic probes (:data:`GENERIC_PROBES`) need nothing from the env's author; an env plugin adds the
probes only it can write through the ``register_probes`` hook (see :mod:`skyrl_core.hookspecs`). An
env may exempt a generic probe that cannot hold for it, with the reason, in its class attribute
``adversarial_exempt`` (shown in the report).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from skyrl_core.env import EnvConfig, Message, TextEnv
from skyrl_core.factory import env_class, validate_config
from skyrl_core.oracle import task_name
from skyrl_core.probe import Probe, Turn
from skyrl_core.registry import did_you_mean

WRONG = "I am not sure."
EOS_TOKENS = "<|endoftext|><|im_end|></s><|eot_id|>"
SUCCESS_METRICS = ("success", "passed", "correct", "solved")
_WORD = re.compile(r"[A-Za-z]+")
_EPS = 1e-9


def near_miss(action: str) -> str:
    """``action`` made wrong but kept in form: every digit shifted by one, else one letter changed in the
    middle of its longest word that is not markup (``<answer>blue</answer>`` -> ``<answer>blve</answer>``)."""
    if any(char.isdigit() for char in action):
        return re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), action)
    words = [m for m in _WORD.finditer(action) if not action[:m.start()].endswith(("<", "</"))]
    if not words:
        return action + " x"
    word = max(words, key=lambda m: len(m.group()))
    at = word.start() + len(word.group()) // 2
    letter = action[at]
    changed = "a" if letter.lower() == "z" else chr(ord(letter.lower()) + 1)
    return action[:at] + changed + action[at + 1:]


def _at(position: Literal["first", "middle", "last"], text: str) -> Callable[[Turn], str]:
    def act(turn: Turn) -> str:
        where = {"first": 1, "middle": max((turn.max_turns + 1) // 2, 1), "last": turn.max_turns}[position]
        return text if turn.number == where else WRONG
    return act


def _gold_turn(transform: Callable[[str], str]) -> Callable[[Turn], str]:
    def act(turn: Turn) -> str:
        return transform(turn.gold[turn.number - 1]) if turn.number <= len(turn.gold) else WRONG
    return act


def _gold_prefix(turn: Turn) -> str:
    """The gold actions but the last, then an honest non-answer (an empty reply would be penalised on the last turn)."""
    return turn.gold[turn.number - 1] if turn.number < len(turn.gold) else WRONG


def _wrong_last(turn: Turn) -> str:
    """The honest wrong answer: the last gold action made wrong, on the last turn (the bar of ``"wrong"``)."""
    return near_miss(turn.gold[-1]) if turn.last else WRONG


def _hedged(turn: Turn) -> str:
    wrong = near_miss(turn.gold[-1])
    return f"{wrong}\n{turn.gold[-1]}\n{wrong}" if turn.number == 1 else WRONG


def _split_last_gold(turn: Turn) -> str:
    answer = turn.gold[-1]
    half = len(answer) // 2
    return {1: answer[:half], 2: answer[half:]}.get(turn.number, WRONG)


def _long(turn: Turn) -> str:
    unit = "".join(turn.format_tokens()) or "<answer>"
    return (unit * (200_000 // len(unit) + 1))[:200_000]


def _generic_probes() -> list[Probe]:
    probes = []
    kinds = (("empty", "", "an empty"), ("whitespace", " \n\t  ", "a whitespace-only"),
             ("eos", EOS_TOKENS, "an end-of-sequence-tokens-only"))
    for kind, text, described in kinds:
        for position in ("first", "middle", "last"):
            probes.append(Probe(f"{kind}_{position}", _at(position, text),
                                f"{described} reply on the {position} turn, '{WRONG}' on the others; flagged when it "
                                f"beats the null agent or '{WRONG}' on every turn: that reply dodges a penalty (score "
                                "it as a wrong answer, e.g. in reject_action)", bar="filler"))
    probes += [
        Probe("long", _long, "a 200,000-character reply of the env's own markup; flagged: an over-long reply is "
                             "scored instead of rejected, or breaks the env"),
        Probe("control_chars", lambda turn: "\x00\x07\x1b[2J\r\x08\ud800\udfff\ufffe" + "".join(turn.format_tokens()),
              "control characters, lone surrogates and markup; flagged: such text reaches the reward or crashes the "
              "env"),
        Probe("format_repeated", lambda turn: " ".join(token for token in turn.format_tokens() for _ in range(20)),
              "the env's markup repeated; flagged: the reward checks format without checking the answer"),
        Probe("format_openers", lambda turn: " ".join(t for t in turn.format_tokens() if not t.startswith("</")),
              "the env's opening markup, never closed; flagged: an unclosed tag or fence is read as an answer"),
        Probe("format_closers", lambda turn: " ".join(t for t in turn.format_tokens() if t.startswith("</")) or "</>",
              "the env's closing markup alone; flagged: the parser matches a closer without its opener"),
        Probe("echo", lambda turn: turn.shown, "the last observation (or the prompt) sent back; flagged: text the env "
                                               "wrote counts as the model's answer (check only the model's own text)"),
        Probe("echo_prompt", lambda turn: turn.prompt[-1]["content"] if turn.prompt else "",
              "the prompt sent back every turn; flagged: the task's own text (an example, a hint) scores"),
        Probe("replay", lambda turn: near_miss(turn.gold[0]), "the first gold action made wrong, replayed every turn; "
              "flagged when it beats one honest wrong answer: repeating an action accumulates reward",
              needs_gold=True, bar="wrong"),
        Probe("all_at_once", lambda turn: "\n".join(map(near_miss, turn.gold)) if turn.number == 1 else WRONG,
              "every gold action made wrong, in one reply; flagged when it beats one honest wrong answer: several "
              "tries in one reply score", needs_gold=True, bar="wrong"),
        Probe("near_miss", _gold_turn(near_miss), "each gold action made wrong (digits shifted, letters swapped); "
              "flagged when it earns the gold's full reward: the check accepts a wrong answer", needs_gold=True,
              bar="gold"),
        Probe("gold_hedged", _hedged, "the right answer between two wrong ones, in one reply; flagged when it beats "
              "one honest wrong answer: any of several answers pays, so a policy learns to hedge (score the first "
              "or the last answer, or refuse several)", needs_gold=True, bar="wrong"),
        Probe("gold_split", _split_last_gold, "the last gold action cut in two halves sent on two turns; flagged when "
              "it beats one honest wrong answer: the env joins replies into one answer", needs_gold=True,
              bar="wrong"),
        Probe("gold_truncated", _gold_prefix, "the gold actions without the last one, then non-answers; flagged "
              "when it still earns the gold's full reward: the final turn is not what pays", needs_gold=True,
              bar="gold"),
    ]
    return probes


GENERIC_PROBES: tuple[Probe, ...] = tuple(_generic_probes())
QUICK_PROBES = frozenset({"empty_last", "whitespace_first", "eos_middle", "long", "control_chars", "format_repeated",
                          "format_openers", "echo", "near_miss", "gold_hedged", "gold_truncated"})


@dataclass
class Episode:
    """One played episode: its summed reward and how it ended."""

    reward: float = 0.0
    error: str | None = None  # the env's info["error"]
    raised: str | None = None  # an exception out of reset/step
    success: float | None = None
    action: str = ""  # the last action and what it got back, for the report
    observation: str = ""


@dataclass
class ProbeOutcome:
    """A probe on every sampled task; ``flags`` has one entry per flagged task."""

    probe: str
    about: str
    rewards: list[float] = field(default_factory=list)
    null: list[float] = field(default_factory=list)
    gold: list[float | None] = field(default_factory=list)
    success: list[float | None] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    example: dict[str, str] | None = None  # action and observation of the first flag

    @staticmethod
    def _mean(values: Sequence[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return sum(known) / len(known) if known else None

    def summary(self) -> dict[str, Any]:
        return {"probe": self.probe, "tasks": len(self.rewards), "mean_reward": self._mean(self.rewards),
                "null": self._mean(self.null), "gold": self._mean(self.gold), "success": self._mean(self.success),
                "flagged": bool(self.flags), "why": self.flags, "example": self.example, "about": self.about}


class RewardHackError(AssertionError):
    """A probe was flagged (``check_adversarial(..., raise_on_flag=True)``); the message lists each flag."""


@dataclass
class AdversarialReport:
    env: str
    tasks: list[str] = field(default_factory=list)
    outcomes: list[ProbeOutcome] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    exempt: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def flagged(self) -> list[ProbeOutcome]:
        return [outcome for outcome in self.outcomes if outcome.flags]

    @property
    def ok(self) -> bool:
        return not self.flagged and not self.leaks

    def problems(self) -> list[str]:
        """One line per flag: ``probe: task: why``, and each state leak."""
        return [f"{o.probe}: {why}" for o in self.flagged for why in o.flags] + [f"state leak: {leak}" for leak in
                                                                                self.leaks]

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "tasks": self.tasks, "ok": self.ok, "probes": [o.summary() for o in self.outcomes],
                "leaks": self.leaks, "exempt": self.exempt, "skipped": self.skipped}


def check_adversarial(env: str | type[TextEnv], *, tasks: Sequence[Mapping[str, Any]] | None = None,
                      config: EnvConfig | Mapping[str, Any] | None = None, n_tasks: int = 2, seed: int = 0,
                      quick: bool = False, probes: Sequence[Probe] | None = None, skip: Collection[str] = (),
                      raise_on_flag: bool = False,
                      progress: Callable[[int, int], None] | None = None) -> AdversarialReport:
    """Play every probe on ``n_tasks`` tasks (default: the first rows of the env's dataset; 0: all) and flag
    what scores above the null agent, raises, ends as an env error, or leaks state across episodes.

    ``probes`` default to the generic ones plus those plugins registered for the env id; ``quick``
    keeps :data:`QUICK_PROBES` and the plugins' own. ``skip`` names probes to leave out. With
    ``raise_on_flag`` (a test's one line) a flag raises :class:`RewardHackError`. ``progress(done, total)``
    is called after each probe's episode (the CLI draws a bar with it).
    """
    env_id = env if isinstance(env, str) else None
    cls = env_class(env) if isinstance(env, str) else env
    if not isinstance(config, EnvConfig):
        config = validate_config(cls.config_class, config or {}, "env")
    rows = list(tasks if tasks is not None else cls.load_dataset("train", config))[:n_tasks or None]
    if not rows:
        raise ValueError(f"{cls.__name__}: no tasks to probe (pass tasks=...)")
    chosen = list(probes) if probes is not None else [*GENERIC_PROBES, *registered_probes(env_id)]
    unknown = sorted(set(skip) - {probe.name for probe in chosen})
    if unknown:
        raise ValueError(f"unknown probe {unknown[0]!r} in skip.{did_you_mean(unknown[0], [p.name for p in chosen])}")
    report = AdversarialReport(env_id or cls.__name__, [task_name(row, i) for i, row in enumerate(rows)])
    exempt = dict(getattr(cls, "adversarial_exempt", {}))
    for probe in chosen:
        if probe.name in skip:
            report.skipped[probe.name] = "skipped by request"
        elif probe.name in exempt:
            report.exempt[probe.name] = exempt[probe.name]
        elif quick and probe.env is None and probe.name not in QUICK_PROBES:
            report.skipped[probe.name] = "not in --quick"
    active = [p for p in chosen if p.name not in report.exempt and p.name not in report.skipped]
    outcomes = {probe.name: ProbeOutcome(probe.name, probe.about) for probe in active}
    total, done = len(rows) * len(active), 0
    for name, row in zip(report.tasks, rows, strict=True):
        gold_actions = _gold(cls, config, row, seed)
        null = play_null(cls, config, row, seed, gold_actions)
        gold = play_gold(cls, config, row, seed) if gold_actions else None
        references = {"null": null, "gold": gold}
        for probe in active:
            if probe.needs_gold and not gold_actions:
                continue
            if probe.bar in ("filler", "wrong") and probe.bar not in references:
                act = _wrong_last if probe.bar == "wrong" else (lambda turn: WRONG)
                references[probe.bar] = play(cls, config, row, seed, act, gold_actions)
            episode = play(cls, config, row, seed, probe.act, gold_actions)
            _score(outcomes[probe.name], probe, name, episode, references)
            done += 1
            if progress is not None:
                progress(done, total)
        leak = _leak(cls, config, row, seed, gold_actions, null)
        if leak:
            report.leaks.append(f"{name}: {leak}")
    report.outcomes = list(outcomes.values())
    if raise_on_flag and not report.ok:
        raise RewardHackError(f"{report.env}: {len(report.problems())} reward hack(s) found:\n  "
                              + "\n  ".join(report.problems()))
    return report


def registered_probes(env_id: str | None) -> list[Probe]:
    """The probes plugins registered (``register_probes``) for ``env_id``."""
    if env_id is None:
        return []
    from skyrl_core.plugins import get_plugin_manager

    return [probe for probe in get_plugin_manager().probes() if probe.env == env_id]


def play(cls: type[TextEnv], config: EnvConfig, row: Mapping[str, Any], seed: int, act: Callable[[Turn], str],
         gold: list[str], env: TextEnv | None = None, as_oracle: bool = False) -> Episode:
    """One episode of ``act`` on ``row`` (in ``env`` when given: it is reset, not closed).

    ``as_oracle`` asks the env for its gold actions after the reset, as an oracle run does (an env may
    prepare its task for them, e.g. place the reference solution), and plays those.
    """
    episode = Episode()
    own = env is None
    env = env or cls(task=row, config=config)
    try:
        prompt, _ = env.reset(seed=seed, options={"task": dict(row)})
        if as_oracle:
            gold = list(env.gold_actions() or [])
        observations: list[list[Message]] = []
        actions: list[str] = []
        for number in range(1, env.max_turns + 1):
            action = act(Turn(number, env.max_turns, prompt, observations, actions, gold))
            result = env.step(action)
            episode.reward += result.reward
            actions.append(action)
            observations.append(result.observation)
            episode.action, episode.observation = action, "\n".join(m["content"] for m in result.observation)
            if result.terminated or result.truncated:
                episode.error = result.info.get("error")
                break
        metrics = env.get_metrics()
        episode.success = next((float(metrics[key]) for key in SUCCESS_METRICS if key in metrics), None)
    except Exception as exc:  # noqa: BLE001 - what the probe provoked is reported, not raised
        episode.raised = f"{type(exc).__name__}: {exc}"
    finally:
        if own:
            env.close()
    return episode


def play_gold(cls: type[TextEnv], config: EnvConfig, row: Mapping[str, Any], seed: int,
              env: TextEnv | None = None) -> Episode:
    """The env's own gold actions on ``row``, played as an oracle run plays them."""
    return play(cls, config, row, seed, _gold_turn(lambda action: action), [], env=env, as_oracle=True)


def play_null(cls: type[TextEnv], config: EnvConfig, row: Mapping[str, Any], seed: int, gold: list[str],
              env: TextEnv | None = None) -> Episode:
    """The null agent on ``row`` (in ``env`` when given): the env's :meth:`~TextEnv.null_action` every turn."""
    target = env or cls(task=row, config=config)
    try:
        return play(cls, config, row, seed, lambda turn: target.null_action(), gold, env=target)
    finally:
        if env is None:
            target.close()


def _gold(cls: type[TextEnv], config: EnvConfig, row: Mapping[str, Any], seed: int) -> list[str]:
    """The task's gold actions, from an env of their own (asking may arm an oracle mode in that env)."""
    env = cls(task=row, config=config)
    try:
        env.reset(seed=seed, options={"task": dict(row)})
        return list(env.gold_actions() or [])
    finally:
        env.close()


def _score(outcome: ProbeOutcome, probe: Probe, name: str, episode: Episode,
           references: Mapping[str, Episode | None]) -> None:
    null, gold = references["null"], references["gold"]
    assert null is not None
    outcome.rewards.append(episode.reward)
    outcome.null.append(null.reward)
    outcome.gold.append(gold.reward if gold else None)
    outcome.success.append(episode.success)
    why = _why(probe, episode, references)
    if why:
        outcome.flags.append(f"{name}: {why}")
        if outcome.example is None:
            outcome.example = {"task": name, "action": episode.action[:300], "observation": episode.observation[:300]}


def _why(probe: Probe, episode: Episode, references: Mapping[str, Episode | None]) -> str | None:
    """Why ``episode`` of ``probe`` is flagged, or None."""
    null, gold, wrong, filler = (references.get(key) for key in ("null", "gold", "wrong", "filler"))
    assert null is not None
    if episode.raised:
        return f"the env raised {episode.raised}"
    if episode.error and not null.error:
        return f"the episode ended as an env error, which drops it from training: {episode.error}"
    if probe.bar == "gold":
        if gold is not None and gold.reward > null.reward + _EPS and episode.reward >= gold.reward - _EPS:
            return f"reached the gold's full reward {gold.reward:g} without doing what the gold does"
        return None
    if probe.bar == "wrong" and wrong is not None and wrong.reward > null.reward:
        beaten = episode.reward > wrong.reward + _EPS
        return f"scored {episode.reward:g}, above an honest wrong answer's {wrong.reward:g}" if beaten else None
    if episode.reward > null.reward + _EPS:
        return f"scored {episode.reward:g}, above the null agent's {null.reward:g}"
    if probe.bar == "filler" and filler is not None and episode.reward > filler.reward + _EPS:
        return f"scored {episode.reward:g}, above '{WRONG}' on every turn ({filler.reward:g}): the reply dodged a penalty"
    return None


def _leak(cls: type[TextEnv], config: EnvConfig, row: Mapping[str, Any], seed: int, gold: list[str],
          null: Episode) -> str | None:
    """The null agent's reward after a gold episode on the same env, where it differs from a fresh env's."""
    if not gold:
        return None
    env = cls(task=row, config=config)
    try:
        play_gold(cls, config, row, seed, env=env)
        after = play_null(cls, config, row, seed, gold, env=env)
    finally:
        env.close()
    if after.raised or abs(after.reward - null.reward) > _EPS:
        return (f"after a gold episode on the same env, the null agent scored "
                f"{after.raised or f'{after.reward:g}'} instead of {null.reward:g}: state survives reset()")
    return None
