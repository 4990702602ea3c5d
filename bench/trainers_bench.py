"""Throughput of the ``hf`` engine and of one GRPO training step, each beside a plain baseline.

Generation (16 chat prompts, greedy, ``--max-tokens`` new tokens each):
  * baseline: ``model.generate`` called once per request, one after another;
  * ``model.generate`` on one left-padded batch of all 16;
  * hf engine, one request at a time;
  * hf engine, 16 concurrent requests (batched by the engine);
  * hf engine, 16 requests arriving 20 ms apart (each joins the batch already decoding).
GRPO sampling (8 chat prompts x 4 samples, temperature 1, at most ``--max-tokens`` new tokens, EOS stops):
  * baseline: ``model.generate`` on one left-padded batch of the 32 rows (``do_sample``);
  * hf engine, 32 concurrent requests (the 4 samples of a prompt share its prefill);
  * the compute floor: 2 * parameters FLOPs per prefilled and generated token at the measured
    GFLOP/s of a large ``torch.matmul`` (decode is bound by streaming the weights, so it is not reached).
Training (the 16 prompt+response pairs from the engine, GRPO-style advantages):
  * baseline: a bare forward / token log-likelihood loss / backward / AdamW step on an unwrapped model;
  * one ``fsdp_grpo`` step: ``TrainWorker.train_step`` (FSDP2, world size 1, PPO-clip, token mean);
LoRA against full fine-tuning (``--lora-rank``, default 8, all-linear targets; 0 skips it): the same
``fsdp_grpo`` step on the same sequences, each variant's worker alone in a fresh process, so its
peak memory (RSS, or CUDA max allocated) is that worker's only; the ratios are LoRA / full.
Each row is the best of 3 runs; ratios are against the baseline of the same table, measured in the
same run. Peak memory is the highest RSS during the phase (sampled every 5 ms), or CUDA max
allocated on a GPU.

    python bench/trainers_bench.py                       # tiny-random and smollm2-135m on CPU
    python bench/trainers_bench.py --models tiny-random --device cuda
    python bench/trainers_bench.py --models smollm2-135m --skip-generation   # training table only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from skyrl_core.engine import SamplingParams
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.models import load_model_and_tokenizer

TOPICS = ["a lighthouse", "the ocean", "a robot", "a garden", "the moon", "a library", "an old map", "a river",
          "a clock", "a forest", "a violin", "a desert", "a train", "a volcano", "a letter", "a snowstorm"]


@dataclass
class Row:
    name: str
    tokens: int
    seconds: float
    peak_mb: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class PeakMemory:
    """Highest RSS (CPU) or max allocated CUDA memory while the ``with`` block runs, in MiB."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak_mb = 0.0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20
        else:
            self._stop.set()
            self._thread.join()

    def _sample(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, current_rss_mb())
            if self._stop.wait(0.005):
                return


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(name: str, device: str, fn: Callable[[], int], repeats: int = 3) -> Row:
    """Best of ``repeats`` runs (the CPUs are shared, so the fastest run is the least disturbed one)."""
    best, tokens = float("inf"), 0
    with PeakMemory(device) as memory:
        for _ in range(repeats):
            started = time.perf_counter()
            tokens = fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - started)
    return Row(name, tokens, best, memory.peak_mb)


def print_table(title: str, rows: list[Row], unit: str) -> None:
    base = rows[0].tokens_per_s
    print(f"\n{title}")
    print(f"| {'method':<52} | {unit:>8} | {'seconds':>8} | {'tokens/s':>9} | {'vs baseline':>11} | {'peak MiB':>8} |")
    print(f"|{'-' * 54}|{'-' * 10}|{'-' * 10}|{'-' * 11}|{'-' * 13}|{'-' * 10}|")
    for r in rows:
        print(f"| {r.name:<52} | {r.tokens:>8} | {r.seconds:>8.2f} | {r.tokens_per_s:>9.1f} | "
              f"{r.tokens_per_s / base:>10.2f}x | {r.peak_mb:>8.0f} |")


# --- generation ----------------------------------------------------------------------------------

def prompts_for(tokenizer) -> list[list[int]]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": f"Write a long story about {t}."}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for t in TOPICS]


def generated_length(ids: list[int], eos: int, pad: int) -> int:
    """New tokens up to and including the first EOS (``model.generate`` pads finished rows)."""
    return ids.index(eos) + 1 if eos in ids else len([i for i in ids if i != pad or pad == eos])


def hf_generate_each(model, tokenizer, prompts, max_tokens) -> int:
    total = 0
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        total += generated_length(out[0, len(prompt):].tolist(), tokenizer.eos_token_id, -1)
    return total


def hf_generate_batch(model, tokenizer, prompts, max_tokens) -> int:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    return sum(generated_length(row[width:].tolist(), tokenizer.eos_token_id, -1) for row in out)


def engine_sequential(engine, prompts, params) -> tuple[int, list]:
    async def run():
        return [await engine.generate(p, params) for p in prompts]
    outs = asyncio.run(run())
    return sum(len(o.token_ids) for o in outs), outs


def engine_concurrent(engine, prompts, params) -> tuple[int, list]:
    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    outs = asyncio.run(run())
    return sum(len(o.token_ids) for o in outs), outs


def engine_staggered(engine, prompts, params, gap_s: float) -> int:
    """Requests arriving ``gap_s`` apart, as turns of multi-turn episodes do: they join the running batch."""
    async def one(i: int, prompt: list[int]):
        await asyncio.sleep(i * gap_s)
        return await engine.generate(prompt, params)

    async def run():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return sum(len(o.token_ids) for o in asyncio.run(run()))


def bench_generation(name: str, model, tokenizer, device: str, max_tokens: int) -> list:
    prompts = prompts_for(tokenizer)
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    engine = HFEngine.from_model(model, tokenizer, HFEngineConfig(max_batch_size=len(prompts)))
    engine_concurrent(engine, prompts[:2], params.model_copy(update={"max_tokens": 2}))  # warm-up
    outputs: list = []

    def concurrent() -> int:
        tokens, outs = engine_concurrent(engine, prompts, params)
        outputs[:] = outs
        return tokens

    with torch.inference_mode():
        rows = [measure("model.generate, one request at a time (baseline)", device,
                        lambda: hf_generate_each(model, tokenizer, prompts, max_tokens)),
                measure("model.generate, one padded batch of 16", device,
                        lambda: hf_generate_batch(model, tokenizer, prompts, max_tokens))]
    rows += [measure("hf engine, 1 request at a time", device, lambda: engine_sequential(engine, prompts, params)[0]),
             measure("hf engine, 16 concurrent requests (batched)", device, concurrent),
             measure("hf engine, 16 requests 20 ms apart (joining)", device,
                     lambda: engine_staggered(engine, prompts, params, 0.02))]
    engine.close()
    print_table(f"Generation: {name} on {device}, 16 prompts, greedy, max {max_tokens} new tokens", rows, "tokens")
    return [p + o.token_ids for p, o in zip(prompts, outputs, strict=True)], [len(p) for p in prompts], outputs


def sample_once(model, tokenizer, max_tokens: int) -> tuple[list[list[int]], list[int], list]:
    """The generation table's 16 greedy sequences, without timing anything."""
    prompts = prompts_for(tokenizer)
    engine = HFEngine.from_model(model, tokenizer, HFEngineConfig(max_batch_size=len(prompts)))
    _, outputs = engine_concurrent(engine, prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    engine.close()
    return [p + o.token_ids for p, o in zip(prompts, outputs, strict=True)], [len(p) for p in prompts], outputs


def matmul_gflops(device: str, size: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    best = float("inf")
    for _ in range(3):
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 * repeats / best / 1e9


def hf_sample_batch(model, tokenizer, prompts, max_tokens, samples) -> int:
    rows = [p for p in prompts for _ in range(samples)]
    width = max(len(p) for p in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=model.device)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True, temperature=1.0,
                         top_p=1.0, top_k=0, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    return sum(generated_length(row[width:].tolist(), tokenizer.eos_token_id, -1) for row in out)


def bench_grpo_sampling(name: str, model, tokenizer, device: str, max_tokens: int, samples: int = 4) -> None:
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Write a short poem about {t}."}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
               for t in TOPICS[:8]]
    engine = HFEngine.from_model(model, tokenizer, HFEngineConfig(max_batch_size=len(prompts) * samples))
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_k=0)

    def grpo_round() -> int:
        async def run():
            return await asyncio.gather(*(engine.generate(p, params) for p in prompts for _ in range(samples)))
        return sum(len(o.token_ids) for o in asyncio.run(run()))

    grpo_round()  # warm-up
    with torch.inference_mode():
        rows = [measure(f"model.generate, one batch of {len(prompts)}x{samples} (baseline)", device,
                        lambda: hf_sample_batch(model, tokenizer, prompts, max_tokens, samples))]
    rows.append(measure(f"hf engine, {len(prompts)}x{samples} concurrent requests", device, grpo_round))
    engine.close()
    gflops = matmul_gflops(device)
    params_count = sum(p.numel() for p in model.parameters())
    # The floor of the engine's row: its generated tokens and its prefill (one per distinct prompt).
    flops = 2 * params_count * (rows[-1].tokens + sum(len(p) for p in prompts))
    rows.append(Row(f"compute floor ({gflops:.0f} GFLOP/s matmul, 2N FLOPs/token)", rows[-1].tokens,
                    flops / (gflops * 1e9), 0.0))
    print_table(f"GRPO sampling: {name} on {device}, {len(prompts)} prompts x {samples} samples, temperature 1, "
                f"max {max_tokens} new tokens", rows, "tokens")
    print(f"engine time / floor: {rows[1].seconds / rows[2].seconds:.2f}x "
          f"(token counts differ between rows: sampled lengths vary)")


# --- training ------------------------------------------------------------------------------------

def bare_step(model, optimizer, samples, pad_id: int) -> int:
    """Forward, mean token log-likelihood of the responses, backward, AdamW step; no RL, no sharding."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.tensor([s.input_ids + [pad_id] * (width - len(s.input_ids)) for s in samples], device=model.device)
    attention = torch.tensor([[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in samples],
                             device=model.device)
    response = torch.zeros_like(ids, dtype=torch.bool)
    for i, s in enumerate(samples):
        response[i, s.response_start:len(s.input_ids)] = True
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None]).squeeze(2)
    loss = -(logp * response[:, 1:]).sum() / response.sum()
    loss.backward()
    optimizer.step()
    return int(attention.sum())


def measure_bare_step(model, samples, pad_id: int, device: str) -> Row:
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    bare_step(model, optimizer, samples, pad_id)  # warm-up (allocates optimizer state)
    return measure("bare forward/backward/AdamW step (baseline)", device,
                   lambda: bare_step(model, optimizer, samples, pad_id))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def grpo_worker(name: str, device: str, lora_rank: int = 0) -> Iterator:
    import torch.distributed as dist
    from skyrl_trainers.config import FSDPGRPOConfig, LoRAConfig
    from skyrl_trainers.worker import TrainWorker, WorkerSpec

    config = FSDPGRPOConfig(model=name, device="cuda" if device.startswith("cuda") else "cpu", lr=1e-6,
                            micro_batch_tokens=1 << 20, lora=LoRAConfig(rank=lora_rank))
    worker = TrainWorker(0, 1, "127.0.0.1", free_port(), WorkerSpec(config))
    try:
        yield worker
    finally:
        dist.destroy_process_group()


def bench_training(name: str, model, tokenizer, device: str, sequences, prompt_lengths, outputs,
                   lora_rank: int = 8) -> None:
    from skyrl_trainers.batching import TrainSample, plan_step

    lengths = torch.tensor([float(len(o.token_ids)) for o in outputs])
    advantages = ((lengths - lengths.mean()) / (lengths.std() + 1e-6)).tolist()  # any spread of advantages
    samples = [TrainSample(seq, start, [1] * (len(seq) - start), list(o.logprobs), adv)
               for seq, start, o, adv in zip(sequences, prompt_lengths, outputs, advantages, strict=True)]
    total_tokens = sum(len(s.input_ids) for s in samples)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    plans = plan_step(samples, world_size=1, mini_batches=1, micro_batch_tokens=1 << 20)[0]
    rows = [measure_bare_step(model, samples, pad, device)]
    with grpo_worker(name, device) as worker:
        worker.train_step(plans)  # warm-up

        def grpo_step() -> int:
            worker.train_step(plans)
            return total_tokens

        rows.append(measure("fsdp_grpo TrainWorker.train_step (FSDP2, world 1)", device, grpo_step))
    print_table(f"Training: {name} on {device}, one step on {len(samples)} sequences ({total_tokens} tokens)",
                rows, "tokens")
    if lora_rank:
        bench_lora(name, device, plans, total_tokens, lora_rank)


def grpo_step_alone(name: str, device: str, lora_rank: int, plans, tokens: int, threads: int, conn) -> None:
    """Body of a fresh process: build one worker, warm it up (optimizer state), measure its step."""
    torch.set_num_threads(threads)
    label = f"fsdp_grpo step, LoRA r={lora_rank} all-linear" if lora_rank else "fsdp_grpo step, full fine-tuning"
    with grpo_worker(name, device, lora_rank=lora_rank) as worker:
        worker.train_step(plans)

        def step() -> int:
            worker.train_step(plans)
            return tokens

        conn.send(measure(label, device, step))


def bench_lora(name: str, device: str, plans, tokens: int, lora_rank: int) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    rows = []
    for rank in (0, lora_rank):
        parent, child = context.Pipe()
        process = context.Process(target=grpo_step_alone,
                                  args=(name, device, rank, plans, tokens, torch.get_num_threads(), child))
        process.start()
        rows.append(parent.recv())
        process.join()
    full, lora = rows
    print_table(f"LoRA vs full fine-tuning: {name} on {device}, the same step, each worker alone in a fresh process "
                "(baseline: full)", rows, "tokens")
    print(f"LoRA r={lora_rank} / full fine-tuning: step time {lora.seconds / full.seconds:.2f}x, "
          f"peak memory {lora.peak_mb / full.peak_mb:.2f}x ({lora.peak_mb:.0f} / {full.peak_mb:.0f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-tokens", type=int, default=0, help="New tokens per request (0: 64 tiny, 32 else).")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-generation", action="store_true",
                        help="Only the training table (its sequences are then sampled by the hf engine once).")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank of the extra training row (0: none).")
    parser.add_argument("--grpo-only", action="store_true", help="Only the GRPO sampling table.")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared, loaded CPU, multi-threaded OpenMP "
                             "regions stall and make timings erratic; 0 keeps torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    for name in args.models:
        model, tokenizer = load_model_and_tokenizer(name, device=args.device)
        max_tokens = args.max_tokens or (64 if name == "tiny-random" else 32)
        if args.grpo_only:
            bench_grpo_sampling(name, model, tokenizer, args.device, args.max_tokens or 64)
            del model
            continue
        if args.skip_generation:
            sequences, prompt_lengths, outputs = sample_once(model, tokenizer, max_tokens)
        else:
            sequences, prompt_lengths, outputs = bench_generation(name, model, tokenizer, args.device, max_tokens)
            bench_grpo_sampling(name, model, tokenizer, args.device, args.max_tokens or 64)
        if not args.skip_training:
            bench_training(name, model, tokenizer, args.device, sequences, prompt_lengths, outputs, args.lora_rank)
        del model


if __name__ == "__main__":
    main()
