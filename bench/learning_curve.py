"""Does the main job learn? The README's main job for several seeds: reward per step, table and plot.

Runs ``skyrl run --env rlm_repl --trainer fsdp_grpo`` (the env's recommended main-job settings, exactly
what the README's Quickstart runs) once per seed, one after another, each in its own process, and
reads each run's ``metrics.jsonl``:

* ``env/task_reward``: the task's own score (exact answer), unshaped;
* ``reward/mean``: what GRPO optimised (task reward scaled by 0.8, plus 0.1 for a ```repl block that
  runs and 0.1 for a final answer).

The main job walks the starter rows in order, so every three steps cover the twelve task kinds
once: single steps alternate between easy and hard kinds (a sawtooth), and the plot also draws the
mean of the last three steps, which compares like with like.

It prints one table (step x seed, task and shaped reward), then one row per seed: wall time, peak RSS
of the run (its largest process, the trainer; each seed runs under its own parent so the figure is its
own), the seconds of step 1's rollout, task reward of the first and last three steps and the held-out
evaluation before and after training (``eval/reward_mean``, ``eval/pass_rate``). Step 1's rollout is
the same work in every run of a seed (the same tasks, sampling seed and initial weights; the runs part
later, when turn-2 requests join the engine in the order the sandbox answers), so its time is the
control: where it is slower than in an earlier run, the machine was, and the wall times compare only
after scaling by it. It writes ``learning_curve.png`` and
``learning_curve.json`` to ``--out`` and checks that in every seed the mean task reward of the last
three steps is above that of the first three (exit status 1 otherwise).

    python bench/learning_curve.py                      # seeds 0 1 2, 10 to 13 minutes each on 2 cores
    python bench/learning_curve.py --seeds 0 --out /tmp/lc trainer.steps=8   # extra overrides pass through
    python bench/learning_curve.py --out /tmp/lc --replot   # table and plot again from learning_curve.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WINDOW = 3


# runs the command and prints the peak RSS of its largest descendant (ru_maxrss of this parent's children)
MEASURED = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")


def run_seed(seed: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """Train one seed in a fresh process: its per-step metrics, held-out evaluations, wall time and peak RSS."""
    folder = out / f"seed{seed}"
    command = [sys.executable, "-m", "skyrl_core.cli", "run", "--env", "rlm_repl", "--trainer", "fsdp_grpo",
               f"run.seed={seed}", f"run.output_dir={folder}", "run.console=false", "trainer.export=false", *overrides]
    print(f"seed {seed}: {' '.join(command[3:])}", flush=True)
    started = time.perf_counter()
    with open(out / f"seed{seed}.log", "w") as log:
        done = subprocess.run([sys.executable, "-c", MEASURED, *command], stdout=log, stderr=subprocess.PIPE,
                              text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {done.returncode}); its log: {out / f'seed{seed}.log'}\n"
                         f"{done.stderr[-2000:]}")
    peak_gib = int(done.stderr.strip().splitlines()[-1]) / 1024**2
    # the run's own line on what it computed in and why (the same CPU can take bf16 or fp32: see precision.py)
    precision = next((line for line in (out / f"seed{seed}.log").read_text().splitlines()
                      if line.startswith("precision: ")), "precision: (not printed)")
    print(f"seed {seed}: {seconds / 60:.1f} min, peak RSS {peak_gib:.2f} GiB; {precision}", flush=True)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"steps": [r for r in records if "reward/mean" in r],  # training steps, not evaluations
            "evals": [r for r in records if "eval/pass_rate" in r], "seconds": seconds, "peak_rss_gib": peak_gib,
            "precision": precision, "cpu": cpu_name()}


def cpu_name() -> str:
    """The CPU's model name and core count, for the record beside its figures (times depend on both)."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} cores"


def print_seed_summary(runs: dict[int, dict[str, Any]]) -> list[int]:
    """One row per seed (the README's table); returns the seeds whose task reward did not rise."""
    print(f"| seed | wall time, min | peak RSS, GiB | step 1 rollout, s | task reward, steps 1-{WINDOW} -> last {WINDOW} "
          "| shaped reward | eval reward, before -> after | eval pass rate, before -> after | |")
    print("|---|---:|---:|---:|---|---|---|---|---|")
    failed = []
    for seed, run in sorted(runs.items()):
        first, last = window_means([s["env/task_reward"] for s in run["steps"]])
        shaped_first, shaped_last = window_means([s["reward/mean"] for s in run["steps"]])
        evals = run["evals"]
        before, after = (evals[0], evals[-1]) if len(evals) > 1 else ({}, {})
        ok = last > first
        failed += [] if ok else [seed]
        control = run["steps"][0].get("time/generate_seconds", float("nan"))
        print(f"| {seed} | {run['seconds'] / 60:.1f} | {run['peak_rss_gib']:.2f} | {control:.1f} | {first:.3f} -> {last:.3f} | "
              f"{shaped_first:.3f} -> {shaped_last:.3f} | {_pair(before, after, 'eval/reward_mean')} | "
              f"{_pair(before, after, 'eval/pass_rate')} | {'PASS' if ok else 'FAIL'} |")
    return failed


def _pair(before: dict[str, float], after: dict[str, float], key: str) -> str:
    return f"{before[key]:.3f} -> {after[key]:.3f}" if key in before and key in after else "-"


def window_means(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values[:WINDOW]), statistics.fmean(values[-WINDOW:])


def print_table(curves: dict[int, list[dict[str, float]]]) -> None:
    seeds = sorted(curves)
    header = "| step | " + " | ".join(f"seed {s} task | seed {s} shaped" for s in seeds) + " |"
    print(header)
    print("|" + "---|" * (1 + 2 * len(seeds)))
    for index in range(max(len(c) for c in curves.values())):
        cells = []
        for seed in seeds:
            row = curves[seed][index] if index < len(curves[seed]) else {}
            cells += [f"{row.get('env/task_reward', float('nan')):.3f}", f"{row.get('reward/mean', float('nan')):.3f}"]
        print(f"| {index + 1} | " + " | ".join(cells) + " |")


def plot(curves: dict[int, list[dict[str, float]]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is missing: installing it for the plot", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for index, (seed, steps) in enumerate(sorted(curves.items())):
        x = [int(s["step"]) if "step" in s else i + 1 for i, s in enumerate(steps)]
        colour = f"C{index}"
        for axis, key in zip(axes, ("env/task_reward", "reward/mean"), strict=True):
            values = [s[key] for s in steps]
            axis.plot(x, values, marker="o", alpha=0.35, color=colour)
            # mean of the last WINDOW steps: one cycle of the task kinds, so the line tracks learning
            rolling = [statistics.fmean(values[max(0, i - WINDOW + 1):i + 1]) for i in range(len(values))]
            axis.plot(x[WINDOW - 1:], rolling[WINDOW - 1:], linewidth=2.5, color=colour,
                      label=f"seed {seed} ({WINDOW}-step mean)")
    for axis, title in zip(axes, ("task reward (env/task_reward)", "shaped reward (reward/mean)"), strict=True):
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend()
    axes[0].set_ylabel("mean over the step's episodes")
    figure.suptitle("skyrl run --env rlm_repl --trainer fsdp_grpo (SmolLM2-135M, starter curriculum)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/learning-curve"))
    parser.add_argument("overrides", nargs="*", help="Dotted overrides passed to every run (section.key=value).")
    parser.add_argument("--replot", action="store_true", help="Redraw the table and plot from --out's "
                        "learning_curve.json instead of training.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads((args.out / "learning_curve.json").read_text())
        runs = {int(seed): run for seed, run in saved.items()}
        args.seeds = sorted(runs)
    else:
        runs = {seed: run_seed(seed, args.out, args.overrides) for seed in args.seeds}
        (args.out / "learning_curve.json").write_text(json.dumps({str(k): v for k, v in runs.items()}, indent=1))
    curves = {seed: run["steps"] for seed, run in runs.items()}
    print_table(curves)
    print()
    failed = print_seed_summary(runs)
    for seed, run in runs.items():
        print(f"seed {seed}: {run.get('cpu', 'unknown CPU')}; {run.get('precision', 'precision: (not recorded)')}")
    plot(curves, args.out / "learning_curve.png")
    print(f"plot: {args.out / 'learning_curve.png'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
