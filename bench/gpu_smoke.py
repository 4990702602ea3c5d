"""GPU smoke test: one GRPO step with FSDP2 on CUDA, rollouts from the hf engine (and vLLM when installed).

For each engine: 16 rollouts -> one ``fsdp_grpo`` train step (bf16 mixed precision, world size 1)
-> weight sync into the engine -> 16 more rollouts with the new weights. Prints step time, tokens/s
and peak GPU memory per phase, and fails (exit 1) if the whole run exceeds ``--budget-s``.
On a machine without CUDA it says so and exits 0.

    python bench/gpu_smoke.py                       # smollm2-135m
    python bench/gpu_smoke.py --model tiny-random
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import socket
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=300.0)
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
        hf, _, _ = timed("load hf engine", lambda: HFEngine(HFEngineConfig(model=args.model, device="cuda")))
        smoke("hf engine", hf, worker, args.max_tokens)
        hf.close()
        del hf
        if importlib.util.find_spec("vllm") is None:
            print("\n[vllm] not installed: skipped (pip install 'skyrl-trainers[vllm]')")
        else:
            from skyrl_trainers.engines.vllm import VLLMEngine, VLLMEngineConfig

            vllm, _, _ = timed("load vllm engine", lambda: VLLMEngine(VLLMEngineConfig(
                model=args.model, gpu_memory_utilization=0.3, enable_sleep_mode=True)))
            smoke("vllm engine", vllm, worker, args.max_tokens)
            timed("vllm sleep + wake_up", lambda: (asyncio.run(vllm.sleep(1)), asyncio.run(vllm.wake_up())))
            vllm.close()
    finally:
        dist.destroy_process_group()
    total = time.perf_counter() - started
    print(f"\ntotal {total:.1f} s (budget {args.budget_s:.0f} s)")
    return 0 if total <= args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
