"""A tiny-random smoke run, as a new user sees it on the console: the ``loss 0 grad 0`` of step 1 is
explained at once, the summary says where the time went (setup and evaluation included), and no stray
output (transformers' shard bar, a leftover episodes bar, ``[rank0]:`` on traceback lines) appears."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from skyrl_trainers.signal import NoSignalMonitor

SKYRL = Path(sys.executable).with_name("skyrl")
NOTE = "step 1 had no learning signal: all samples of each task got the same reward"
PARTS = ("setup", "evaluation", "generation_and_env", "training", "weight_sync", "checkpoint", "export", "other")
SMALL = ["trainer.batch_size=2", "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=8",
         "generator.max_total_tokens=16", "trainer.micro_batch_tokens=512", "trainer.eval_samples=2"]


def _environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def _summary(stdout: str) -> dict[str, float]:
    """The ``run summary`` table's rows that hold numbers."""
    rows = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\s*(\S+)\s+(-?[\d.]+(?:e[+-]\d+)?)\s*", line)
        if match:
            rows[match[1]] = float(match[2])
    return rows


def test_the_first_step_without_signal_is_explained_at_once_and_only_once():
    monitor = NoSignalMonitor(patience=3, hints={"model": "tiny-random"})
    flat = {"a": [0.0, 0.0], "b": [0.0, 0.0]}
    notes = []
    for step in (1, 2, 3, 4):
        monitor.update(step, 1.0, flat)
        notes.append(monitor.first_note(step))
    assert notes[0] is not None and notes[1:] == [None, None, None]
    assert notes[0].startswith(NOTE)
    assert "no sample solved its task" in notes[0] and "expected with tiny-random" in notes[0]
    assert "3 steps in a row (trainer.no_signal_patience)" in notes[0]

    other = NoSignalMonitor(patience=3, hints={"model": "smollm2-135m"})
    other.update(1, 0.0, {"a": [0.0, 1.0]})
    assert other.first_note(1) is None  # a step with signal needs no note
    other.update(2, 1.0, {"a": [1.0, 1.0]})
    note = other.first_note(2)
    assert note is not None and note.startswith("step 2 had no learning signal")
    assert "every sample solved its task" in note and "tiny-random" not in note

    at_once = NoSignalMonitor(patience=1)  # the full warning comes at this step: no note beside it
    at_once.update(1, 1.0, flat)
    assert at_once.first_note(1) is None


def test_a_tiny_random_smoke_run_explains_itself_and_accounts_for_its_time(tmp_path):
    out = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "trainer.steps=2", *SMALL, f"run.output_dir={out}", "run.seed=3"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_environment())
    wall = time.perf_counter() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]

    lines = result.stderr.splitlines()
    step_line = next(i for i, line in enumerate(lines) if line.startswith("step 1 "))
    assert "loss 0" in lines[step_line] and "grad 0" in lines[step_line]
    note = lines[step_line + 1]  # right under the step it explains, on one line
    assert note.startswith(NOTE), result.stderr
    assert "no sample solved its task" in note and "expected with tiny-random" in note
    assert result.stderr.count("had no learning signal") == 1

    assert "Writing model shards" not in output
    assert "[rank0]:" not in output
    assert not [line for line in lines if line.strip().startswith("episodes")], result.stderr  # no stray bar
    assert (out / "export" / "config.json").is_file()  # the export ran, silently

    summary = _summary(result.stdout)
    total = summary["time/total_seconds"]
    parts = {part: summary[f"time/{part}_seconds"] for part in PARTS}
    assert total >= sum(parts.values()) * 0.99, summary  # the table rounds to 4 digits
    assert total <= wall, (total, wall)  # the time the user waited, not more
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    eval_seconds = sum(r["eval/seconds"] for r in records if "eval/seconds" in r)
    assert [r["step"] for r in records if "eval/seconds" in r] == [0, 2]
    assert parts["evaluation"] >= eval_seconds * 0.99  # both evaluations, the one before step 1 included
    assert total >= summary["time/step_loop_seconds"] + records[0]["eval/seconds"] * 0.99
    assert parts["generation_and_env"] >= sum(r["time/generate_seconds"] for r in records if r["step"]) * 0.99
    assert parts["setup"] > 0 and parts["export"] > 0 and parts["checkpoint"] > 0


_FAILING_RUN = """
import sys
from skyrl_trainers import trainer

def fail(self, step, overlap_state=None):
    raise RuntimeError("the disk is full")

trainer._StepLoop.checkpoint = fail
from skyrl_core.cli import main
sys.argv = ["skyrl", *sys.argv[1:]]
main()
"""


def test_a_traceback_at_world_size_one_has_no_rank_prefix(tmp_path):
    command = [sys.executable, "-c", _FAILING_RUN, "run", "--env", "reverse_text", "--trainer", "fsdp_grpo",
               "--model", "tiny-random", "trainer.steps=1", *SMALL, "trainer.eval_samples=0", "trainer.export=false",
               "run.console=false", f"run.output_dir={tmp_path / 'run'}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_environment())
    assert result.returncode != 0
    assert "RuntimeError: the disk is full" in result.stderr, result.stderr[-4000:]
    assert "[rank0]" not in result.stderr, result.stderr[-4000:]
