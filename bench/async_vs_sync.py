"""``fsdp_grpo`` in ``sync``, ``one_step_off`` and ``async`` mode on identical work, on CPU.

Work (every mode): the ``spread_bench`` env of ``bench/_spread_env.py`` (multi-turn episodes of 1-10
turns, mostly short with a long tail, each turn followed by a simulated tool call of log-normal
latency around ``--latency-ms``), the same seeded task order, ``--steps`` steps of ``--batch-size``
tasks x ``--group`` samples, tiny-random (``--model``), temperature 1, ``trainer.off_policy.tis=token``
in every mode (so the loss is the same), ``generation_workers = 2 x batch_size`` and ``max_staleness=1``
for ``async``. The engine runs in its own process (``trainer.engine_placement=process``) unless
``--placement in_process``. Each mode runs in its own subprocess, ``--rounds`` times, alternating.

Reported per mode (median over rounds): wall time of the step loop (``time/step_loop_seconds``: setup,
model load and export excluded), samples trained per second, the mean over steps of the generation
and training idle fractions (``async/*_idle_fraction``), the reward of the last three steps
(``reward/last``), async's dropped groups, and the samples/s ratio to ``sync``.

    python bench/async_vs_sync.py                       # 8 steps, batch 4 x 4, 1 round
    python bench/async_vs_sync.py --steps 12 --rounds 2 --latency-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
MODES = ("sync", "one_step_off", "async")


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(BENCH_DIR))
    import _spread_env as env_mod
    from skyrl_core.config import build_config
    from skyrl_core.plugins import get_plugin_manager
    from skyrl_core.registry import Provider
    from skyrl_trainers.trainer import FSDPGRPOTrainer

    pm = get_plugin_manager()
    if not pm.register_plugin(env_mod, Provider("bench-async-vs-sync", "dev")):
        raise SystemExit(f"registering {env_mod.__name__} failed: {pm.failures[-1].error}")
    tasks = Path(tempfile.mkdtemp(prefix="spread-tasks-")) / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in env_mod.make_tasks(64, args.latency_ms)))
    run_dir = tempfile.mkdtemp(prefix=f"{args.mode}-run-")
    config = build_config({
        "env": {"id": env_mod.ENV_ID},
        "generator": {"id": "default", "n_samples_per_prompt": args.group, "max_tokens_per_turn": args.max_tokens,
                      "max_total_tokens": args.max_tokens * 10, "temperature": 1.0},
        "engine": {"id": "hf", "device": "cpu", "dtype": "float32", "max_batch_size": 64,
                   "in_flight_updates": args.in_flight},
        "trainer": {"id": "fsdp_grpo", "model": args.model, "device": "cpu", "batch_size": args.batch_size,
                    "steps": args.steps, "lr": args.lr, "export": False, "samples_per_step": 0,
                    "train_files": [str(tasks)], "mode": args.mode, "max_staleness": 1,
                    "generation_workers": 2 * args.batch_size, "engine_placement": args.placement,
                    "off_policy": {"tis": "token"}},
        "run": {"console": False, "output_dir": run_dir, "seed": 0},
    }, registry=pm.registry)
    summary = FSDPGRPOTrainer(config).fit()
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    records = [r for r in records if "train/samples" in r]  # training steps, not the step-0 evaluation

    def mean(key: str) -> float:
        values = [r[key] for r in records if key in r]
        return sum(values) / len(values) if values else float("nan")

    samples = sum(r["train/samples"] for r in records)
    return {"mode": args.mode, "wall_seconds": summary["time/step_loop_seconds"], "samples": samples,
            "samples_per_second": samples / summary["time/step_loop_seconds"],
            "generation_idle": mean("async/generation_idle_fraction"),
            "training_idle": mean("async/training_idle_fraction"),
            "reward_last": summary.get("reward/last", float("nan")),
            "reward_first": summary.get("reward/first", float("nan")),
            "dropped": sum(r.get("async/dropped_groups", 0.0) for r in records),
            "staleness_max": max((r.get("async/staleness_max", 0.0) for r in records), default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per turn")
    parser.add_argument("--latency-ms", type=float, default=30.0, help="median tool latency per turn")
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--lr", type=float, default=2e-2)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--placement", default="process", choices=["process", "in_process"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--in-flight", default="keep", choices=["off", "keep", "recompute"],
                        help="engine.in_flight_updates (every mode; the trainer's default off sync is keep): "
                             "off waits for the rows in flight before a weight update")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one run, in a subprocess
    args = parser.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args)), flush=True)
        return
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            argv = [sys.executable, __file__, "--mode", mode, *sys.argv[1:]]
            out = subprocess.run(argv, capture_output=True, text=True, check=False)
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode or not lines:
                raise SystemExit(f"{mode} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            results[mode].append(json.loads(lines[-1][7:]))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "mode"} for m, rs in results.items()}
    print(f"work: {args.steps} steps x {args.batch_size} tasks x {args.group} samples, spread_bench "
          f"(1-10 turns, {args.max_tokens} tokens/turn, tool latency median {args.latency_ms:g} ms), {args.model}, "
          f"engine placement {args.placement}, in_flight_updates {args.in_flight}, {args.threads} torch threads, {args.rounds} round(s)")
    header = ("mode", "wall s", "samples/s", "gen idle", "train idle", "reward first->last", "dropped", "vs sync")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    base = med["sync"]["samples_per_second"]
    for mode in MODES:
        r = med[mode]
        print(f"| {mode} | {r['wall_seconds']:.1f} | {r['samples_per_second']:.2f} | {r['generation_idle']:.2f} | "
              f"{r['training_idle']:.2f} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} | {r['dropped']:.0f} | "
              f"{r['samples_per_second'] / base:.2f}x |")


if __name__ == "__main__":
    main()
