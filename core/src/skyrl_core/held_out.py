"""Held-out evaluation: which split an env is evaluated on, and the numbers an evaluation reports.

Training (``trainer.eval_*`` of ``fsdp_grpo``) and ``skyrl rollout`` share these defaults, so a rollout
of an env with no options plays the tasks, with the options, that a run of it evaluates on: the env's
``run_defaults`` and the held-out split of its training split.

An env declares its held-out split for each training split in ``EnvSpec.eval_splits`` (default
``{"train": "test"}``, the convention of ``TextEnv.load_dataset``); a training split it does not list
is evaluated on itself, which is what an env with a single set of tasks declares with ``{}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core.config import env_run_defaults, merge
from skyrl_core.eval_scores import passes
from skyrl_core.registry import EnvSpec, Registry
from skyrl_core.trajectory import TrajectoryBatch

# A GRPO group size is a training choice: a rollout plays --samples episodes per task (default 1).
TRAINING_ONLY = {"generator": ("n_samples_per_prompt",)}


def held_out_split(spec: EnvSpec, train_split: str) -> str:
    """The split ``spec`` declares held out for ``train_split``, else ``train_split`` itself."""
    return str(spec.eval_splits.get(train_split, train_split))


def rollout_defaults(layers: Sequence[Mapping[str, Any]], registry: Registry) -> dict[str, Any]:
    """The lowest config layer of a rollout: what ``skyrl run`` would use for the env, generator and engine
    (the env's ``run_defaults``) without the options only training has (:data:`TRAINING_ONLY`), and with
    the env's ``rollout_defaults`` (what it wants when played without training) over them."""
    layer = env_run_defaults(layers, registry, rollout=True)
    for section, keys in TRAINING_ONLY.items():
        options = {k: v for k, v in layer.get(section, {}).items() if k not in keys}
        if options:
            layer[section] = options
        else:
            layer.pop(section, None)
    return layer


def default_split(layers: Sequence[Mapping[str, Any]], registry: Registry) -> tuple[str, str]:
    """``(split, why)``: the built-in split a command that plays an env without training uses by default.

    ``trainer.eval_split`` when the layers set it, else the env's held-out split for ``trainer.data_split``
    as a run resolves it (the layers, else the env's ``run_defaults``, else ``train``). ``why`` says
    which, for a note on the console.
    """
    raw: dict[str, Any] = {}
    for layer in layers:
        raw = merge(raw, layer)
    env_section = raw.get("env")
    env_id = str(env_section.get("id")) if isinstance(env_section, Mapping) else ""
    spec = registry.get("env", env_id)  # an unknown id: the did-you-mean error
    trainer = raw.get("trainer") if isinstance(raw.get("trainer"), Mapping) else {}
    if trainer.get("eval_split"):
        return str(trainer["eval_split"]), "trainer.eval_split"
    recommended = spec.run_defaults.get("trainer", {})
    train = str(trainer.get("data_split") or recommended.get("data_split") or "train")
    split = held_out_split(spec, train)
    if split == train:
        return split, f"{env_id} evaluates training split {train!r} on itself"
    return split, f"{env_id}'s held-out split for training split {train!r}"


def _eval_name(key: str) -> str:
    """``reward/mean`` -> ``eval/reward_mean``, ``rollout/errors`` -> ``eval/errors``, ``env/x`` -> ``eval/env/x``."""
    section, _, name = key.partition("/")
    if section == "reward" and name:
        return f"eval/reward_{name}"
    if section == "rollout" and name:
        return f"eval/{name}"
    return f"eval/{key}"


def held_out_metrics(batch: TrajectoryBatch, reward_range: tuple[float, float]) -> dict[str, float]:
    """``eval/*`` of an evaluation rollout: its metrics under eval names, plus ``eval/pass_rate`` and
    ``eval/tasks``.

    ``eval/pass_rate`` is the share of episodes that reached the top of the env's ``reward_range`` (or
    their task's lower ``reward_ceiling``) without an error, the bar the oracle holds a solution to (for a shaped reward, a right answer with
    its format bonus). ``eval/env/<name>`` are the env's own metrics (e.g. ``eval/env/task_reward``).
    """
    metrics = {_eval_name(key): float(value) for key, value in batch.metrics.items()}
    episodes = [t for t in batch.roots() if t.is_last_step]
    solved = sum(passes(t, reward_range[1], ceilings=True) for t in episodes)
    metrics["eval/pass_rate"] = solved / len(episodes) if episodes else 0.0
    metrics["eval/tasks"] = float(len({t.group_id for t in episodes}))
    return metrics


def eval_summary(records: Sequence[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """The first and last evaluation of a run, for its summary: ``eval/reward_mean_first|last``,
    ``eval/pass_rate_first|last`` and the steps they were taken after, ``eval/step_first|last``."""
    if not records:
        return {}
    (first_step, first), (last_step, last) = records[0], records[-1]
    summary = {"eval/step_first": float(first_step), "eval/step_last": float(last_step)}
    for key in ("reward_mean", "pass_rate"):
        if f"eval/{key}" in first and f"eval/{key}" in last:
            summary[f"eval/{key}_first"] = float(first[f"eval/{key}"])
            summary[f"eval/{key}_last"] = float(last[f"eval/{key}"])
    return summary


def eval_reward_line(summary: Mapping[str, Any]) -> str | None:
    """``eval reward: 0.125 -> 0.312 (step 0 -> step 12); pass rate: 0.000 -> 0.250`` from a run's
    summary (:func:`eval_summary`), or ``None`` when the run evaluated nothing."""
    keys = ("eval/reward_mean_first", "eval/reward_mean_last", "eval/step_first", "eval/step_last")
    if not all(isinstance(summary.get(key), int | float) for key in keys):
        return None
    line = (f"eval reward: {summary['eval/reward_mean_first']:.3f} -> {summary['eval/reward_mean_last']:.3f} "
            f"(step {int(summary['eval/step_first'])} -> step {int(summary['eval/step_last'])})")
    if isinstance(summary.get("eval/pass_rate_first"), int | float):
        line += f"; pass rate: {summary['eval/pass_rate_first']:.3f} -> {summary['eval/pass_rate_last']:.3f}"
    return line
