"""The console tables of ``skyrl eval``: the first episodes one by one, then one row per task.

Texts are cut so that a table stays readable in a terminal: the prompt to its end (what the model
saw last), the completion to its head and tail (how it started, how it ended). The full episodes are
in the results folder's ``samples.jsonl``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core.trajectory import Trajectory

PROMPT_TAIL_CHARS = 200
COMPLETION_HEAD_CHARS = 160
COMPLETION_TAIL_CHARS = 100
ERROR_CHARS = 120
HIDDEN_METRICS = ("episode_seconds",)  # the generator's timing, not the env's


def prompt_messages(trajectory: Trajectory) -> list[dict[str, str]]:
    """The messages before the model's first turn: all but what the generator appended (each turn's reply
    and, unless the episode ended on it, the env's answer). A prompt may hold assistant messages of its own
    (a worked example), so it is not cut at the first one."""
    if not trajectory.turns:
        return list(trajectory.messages)
    appended = sum(1 + len(turn.observation) for turn in trajectory.turns)
    last = list(trajectory.turns[-1].observation)
    if last and trajectory.messages[-len(last):] != last:  # the episode ended before its answer was appended
        appended -= len(last)
    return list(trajectory.messages[: max(len(trajectory.messages) - appended, 0)])


def prompt_tail(trajectory: Trajectory, limit: int = PROMPT_TAIL_CHARS) -> str:
    """The last ``limit`` characters of the prompt (:func:`prompt_messages`), where the task usually is."""
    text = one_line("\n".join(str(message.get("content", "")) for message in prompt_messages(trajectory)))
    return text if len(text) <= limit else "…" + text[-limit:]


def completion(trajectory: Trajectory, head: int = COMPLETION_HEAD_CHARS, tail: int = COMPLETION_TAIL_CHARS) -> str:
    """The model's turns (with the env's answers between them in brackets), cut to a head and a tail."""
    parts: list[str] = []
    for number, turn in enumerate(trajectory.turns):
        parts.append(turn.action)
        if turn.observation and number < len(trajectory.turns) - 1:
            parts.append("[env: " + " ".join(str(m.get("content", "")) for m in turn.observation) + "]")
    return cut_middle(one_line("\n".join(parts)), head, tail)


def stop_text(trajectory: Trajectory) -> str:
    """How the episode ended: the stop reason, the env's truncation reason, the error's first line."""
    info = trajectory.turns[-1].info if trajectory.turns else {}
    text = trajectory.stop_reason
    if info.get("truncated_reason"):
        text += f" ({info['truncated_reason']})"
    if trajectory.error:
        error = trajectory.error.splitlines()[0] if trajectory.error.strip() else trajectory.error
        text += ": " + (error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 1] + "…")
    return text


def metrics_text(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{key}={number(value)}" for key, value in metrics.items() if key not in HIDDEN_METRICS)


def sample_table(episodes: Sequence[Trajectory], names: Mapping[str, str], show: int, total: int) -> Any:
    """A rich table of the first ``show`` episodes; ``names`` maps a group id to its task's name."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"first {min(show, len(episodes))} of {total} episodes", show_lines=True)
    for column, options in (("task", {"no_wrap": True}), ("#", {"justify": "right"}), ("prompt (end)", {"ratio": 3}),
                            ("completion", {"ratio": 4}), ("reward", {"justify": "right"}),
                            ("env metrics", {"ratio": 1}), ("stop", {"ratio": 1})):
        table.add_column(column, overflow="fold", **options)
    for episode in episodes[:show]:
        table.add_row(escape(names.get(episode.group_id, episode.group_id)), str(episode.sample_index),
                      escape(prompt_tail(episode)), escape(completion(episode)), number(episode.reward),
                      escape(metrics_text(episode.metrics)), escape(stop_text(episode)))
    return table


def task_table(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], samples: int, threshold: float) -> Any:
    """A rich table with one row per task: episodes, passing ones, pass@k for each k, mean@k, errors."""
    from rich.markup import escape
    from rich.table import Table

    columns = ["n", "passed", *(f"pass@{k}" for k in ks), f"mean@{samples}"]
    errors = any(row["errors"] for row in rows)
    table = Table(title=f"per task (passing: reward >= {number(threshold)})")
    table.add_column("task", overflow="fold")
    for column in [*columns, *(["errors"] if errors else [])]:
        table.add_column(column, justify="right")
    for row in rows:
        cells = [number(row[column]) for column in columns] + ([str(row["errors"])] if errors else [])
        table.add_row(escape(str(row["task"])), *cells)
    return table


def one_line(text: str) -> str:
    """``text`` with its line breaks shown as ``⏎`` (a table cell per episode stays one block)."""
    return text.replace("\r\n", "\n").replace("\n", " ⏎ ")


def cut_middle(text: str, head: int, tail: int) -> str:
    """``text``, or its first ``head`` and last ``tail`` characters around a note of what was left out."""
    if len(text) <= head + tail + 40:
        return text
    return f"{text[:head]} … [{len(text) - head - tail:,} characters] … {text[-tail:]}"


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
