"""GPU smoke test: GRPO with FSDP2 on CUDA, rollouts from the hf engine (and vLLM when installed).

``--mode sync`` (per engine): 16 rollouts -> one ``fsdp_grpo`` train step (bf16 mixed precision,
world size 1) -> weight sync into the engine -> 16 more rollouts with the new weights.

``--mode async`` (per engine): what ``trainer.mode=async`` needs of it. An engine with
``in_flight_updates=keep`` takes the trained weights while 16 long rollouts decode; the bench
counts the completions whose tokens carry both policy versions and times the update. Then a
4-step ``skyrl run ... trainer.mode=async`` on ``reverse_text`` trains end to end on the GPU and its
staleness, dropped groups and throughput are printed.

``--mode both`` (the default) runs both. Prints time, tokens/s and peak GPU memory per phase, and
fails (exit 1) if a check fails or the whole run exceeds ``--budget-s``. On a machine without CUDA it
says so and exits 0.

    python bench/gpu_smoke.py                       # smollm2-135m
    python bench/gpu_smoke.py --model tiny-random --mode async
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from skyrl_core.engine import SamplingParams

PROMPTS = [f"Reverse the word '{w}' and explain how you did it." for w in
           ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean",
            "maple", "robot", "sugar", "candle", "forest", "silver", "planet", "garden")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(label: str, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"  {label:<40} {seconds:7.2f} s   peak GPU memory {peak_gib:6.2f} GiB", flush=True)
    return result, seconds, peak_gib


def rollouts(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)

    async def run() -> list[Any]:
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return asyncio.run(run())


def smoke(engine_name: str, engine: Any, worker: Any, max_tokens: int) -> None:
    from skyrl_trainers.batching import TrainSample, plan_step

    tokenizer = engine.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in PROMPTS]
    print(f"\n[{engine_name}]")
    outs, gen_s, _ = timed("generate 16 rollouts", lambda: rollouts(engine, prompts, max_tokens))
    generated = sum(len(o.token_ids) for o in outs)
    print(f"  generation: {generated} tokens, {generated / gen_s:.0f} tokens/s")
    lengths = torch.tensor([float(len(o.token_ids)) for o in outs])
    advantages = ((lengths - lengths.mean()) / (lengths.std() + 1e-6)).tolist()
    samples = [TrainSample(p + o.token_ids, len(p), [1] * len(o.token_ids), list(o.logprobs or []), a)
               for p, o, a in zip(prompts, outs, advantages, strict=True)]
    plans = plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=1 << 16)[0]
    metrics, step_s, _ = timed("fsdp_grpo train step (FSDP2, bf16)", lambda: worker.train_step(plans))
    tokens = sum(len(s.input_ids) for s in samples)
    print(f"  training: {tokens} tokens, {tokens / step_s:.0f} tokens/s, grad_norm {metrics.get('grad_norm_sum', 0):.3f}")
    state = worker.full_state_dict()
    timed("weight sync into the engine", lambda: asyncio.run(engine.update_weights(state)))
    after, _, _ = timed("generate 16 rollouts, new weights", lambda: rollouts(engine, prompts, max_tokens))
    if after[0].metadata.get("weight_version") != 1:
        raise RuntimeError(f"{engine_name}: the engine did not record the weight update")


def in_flight(engine_name: str, engine: Any, worker: Any, max_tokens: int) -> None:
    """An update lands while rollouts decode: completions span two policy versions."""
    tokenizer = engine.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in PROMPTS]
    state = worker.full_state_dict()
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0)

    async def run() -> tuple[list[Any], float]:
        requests = [asyncio.ensure_future(engine.generate(p, params)) for p in prompts]
        await asyncio.sleep(0.5)  # decoding by now
        started = time.perf_counter()
        await engine.update_weights(state)
        update_s = time.perf_counter() - started
        return await asyncio.gather(*requests), update_s

    print(f"\n[{engine_name}, in-flight update]")
    (outs, update_s), total_s, _ = timed("16 rollouts with an update mid-decode", lambda: asyncio.run(run()))
    if any(o.weight_versions is None for o in outs):
        raise RuntimeError(f"{engine_name}: completions carry no per-token weight versions")
    spanning = sum(len(set(o.weight_versions)) > 1 for o in outs)
    generated = sum(len(o.token_ids) for o in outs)
    print(f"  update took {update_s:.2f} s while decoding; {spanning}/16 completions span two versions; "
          f"{generated / total_s:.0f} tokens/s overall")
    if spanning == 0 and all(o.stop_reason == "length" for o in outs):
        raise RuntimeError(f"{engine_name}: the update did not land mid-decode")


def async_run(model: str, engine_id: str, steps: int = 4) -> None:
    """``skyrl run`` in ``trainer.mode=async`` on the GPU, end to end."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "skyrl_core.cli", "run", "--env", "reverse_text", "--trainer", "fsdp_grpo",
                   "--model", model, f"engine.id={engine_id}", "trainer.mode=async", "trainer.off_policy.tis=token",
                   f"trainer.steps={steps}", "trainer.batch_size=8", "generator.n_samples_per_prompt=4",
                   "trainer.device=cuda", "trainer.export=false", "run.console=false", f"run.output_dir={folder}"]
        if engine_id == "vllm":
            command.append("engine.gpu_memory_utilization=0.3")
        print(f"\n[{engine_id} engine, trainer.mode=async: {steps} steps]")
        started = time.perf_counter()
        subprocess.run(command, check=True)
        seconds = time.perf_counter() - started
        records = [json.loads(line) for line in open(f"{folder}/metrics.jsonl") if line.strip()]
        records = [r for r in records if "reward/mean" in r]  # training steps, not the step-0 evaluation
    if len(records) != steps:
        raise RuntimeError(f"async run: {len(records)} steps logged, expected {steps}")
    print(f"  {seconds:.1f} s; staleness max {max(r['async/staleness_max'] for r in records):.0f}, "
          f"dropped groups {sum(r['async/dropped_groups'] for r in records):.0f}, "
          f"generated tokens/s {records[-1]['throughput/generated_tokens_per_second']:.0f}, "
          f"reward {records[0]['reward/mean']:.3f} -> {records[-1]['reward/mean']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA GPU visible to torch (torch.cuda.is_available() is False); nothing to do.")
        return 0
    started = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, model {args.model}")

    import torch.distributed as dist
    from skyrl_trainers.config import FSDPGRPOConfig
    from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
    from skyrl_trainers.worker import TrainWorker, WorkerSpec

    config = FSDPGRPOConfig(model=args.model, device="cuda", precision="bf16", lr=1e-6)
    worker, _, _ = timed("load policy + fully_shard", lambda: TrainWorker(0, 1, "127.0.0.1", free_port(),
                                                                          WorkerSpec(config)))
    try:
        modes = ["sync", "async"] if args.mode == "both" else [args.mode]
        has_vllm = importlib.util.find_spec("vllm") is not None
        if not has_vllm:
            print("\n[vllm] not installed: skipped (pip install 'skyrl-trainers[vllm]')")
        for mode in modes:
            updates = "off" if mode == "sync" else "keep"
            hf, _, _ = timed(f"load hf engine ({updates})", lambda u=updates: HFEngine(HFEngineConfig(
                model=args.model, device="cuda", in_flight_updates=u)))
            (smoke if mode == "sync" else in_flight)("hf engine", hf, worker, args.max_tokens)
            hf.close()
            del hf
            if has_vllm:
                from skyrl_trainers.engines.vllm import VLLMEngine, VLLMEngineConfig

                vllm, _, _ = timed(f"load vllm engine ({updates})", lambda u=updates: VLLMEngine(VLLMEngineConfig(
                    model=args.model, gpu_memory_utilization=0.3, enable_sleep_mode=True, in_flight_updates=u)))
                (smoke if mode == "sync" else in_flight)("vllm engine", vllm, worker, args.max_tokens)
                if mode == "sync":
                    timed("vllm sleep + wake_up", lambda e=vllm: (asyncio.run(e.sleep(1)), asyncio.run(e.wake_up())))
                vllm.close()
                del vllm
    finally:
        dist.destroy_process_group()
    if "async" in modes:
        for engine_id in ["hf", "vllm"] if has_vllm else ["hf"]:
            async_run(args.model, engine_id)
    total = time.perf_counter() - started
    print(f"\ntotal {total:.1f} s (budget {args.budget_s:.0f} s)")
    return 0 if total <= args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
