"""One GRPO update with each prompt in every micro-batch row, against each prompt run once a mini-batch.

Work: the main job's shape (``skyrl run --env rlm_repl --trainer fsdp_grpo``): ``--groups`` prompts of
``--prompt-tokens`` tokens, ``--group-size`` samples each of a first turn, an observation (not trained
on) and a second turn, about ``--response-tokens`` in all (seeded lengths from half to one and a half
times that), ``--micro-batch-tokens`` micro-batches (the default 512), PPO-clip with a token mean, then AdamW.

* ``in rows``: every packed row holds its prompt (``collate(carry_prompts=False)``), as a sharded
  policy still runs;
* ``carried``: rows hold the prompt's last token; the rest runs once a mini-batch and its gradient
  is carried back (:mod:`skyrl_trainers.prompt_cache`), as a single-rank policy runs.

Each variant runs in a fresh process (so its peak RSS is its own), ``--repeats`` updates after a warm
one; the table gives the positions the model runs forward and backward (a carried prompt counts once;
its first forward, without gradient, is not counted), the median update, peak RSS, and the ratio to
``in rows``. The last row checks the two gradients agree (largest difference over the largest entry).

    python bench/carried_prompts.py                     # smollm2-135m (the main job's model), 2 threads
    python bench/carried_prompts.py --model tiny-random --repeats 2
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_samples(args: argparse.Namespace, vocab: int) -> list:
    import random

    from skyrl_trainers.batching import TrainSample

    rng = random.Random(0)
    samples = []
    for _ in range(args.groups):
        prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_tokens)]
        for i in range(args.group_size):
            length = rng.randint(args.response_tokens // 2, args.response_tokens * 3 // 2)
            observation = length // 2
            turn = (length - observation) // 2
            mask = [1] * turn + [0] * observation + [1] * (length - turn - observation)
            response = [rng.randrange(10, vocab) for _ in range(length)]
            samples.append(TrainSample(prompt + response, len(prompt), mask, [-1.0] * length, (-1) ** i * 0.8))
    return samples


def run_variant(args: argparse.Namespace) -> dict:
    import torch
    from skyrl_trainers.batching import plan_step
    from skyrl_trainers.config import FSDPGRPOConfig
    from skyrl_trainers.forward import collate
    from skyrl_trainers.memory import bound_onednn_primitive_cache, fix_malloc_thresholds, use_one_malloc_arena
    from skyrl_trainers.models import load_model_and_tokenizer
    from skyrl_trainers.objective import Normalisers, micro_batch_loss
    from skyrl_trainers.prompt_cache import PromptCache

    use_one_malloc_arena()
    fix_malloc_thresholds()
    bound_onednn_primitive_cache()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    carry = args.variant == "carried"
    model, _ = load_model_and_tokenizer(args.model, dtype=torch.float32, device="cpu")
    model.train()
    cfg = FSDPGRPOConfig(model=args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every update sees the same weights
    [[plan]] = plan_step(make_samples(args, model.config.vocab_size), world_size=1, mini_batches=1, micro_batch_tokens=args.micro_batch_tokens,
                         carried_prompts=carry)
    batches = [collate(micro, carry_prompts=carry) for micro in plan.micro_batches]
    norms = Normalisers(plan.batch_tokens, plan.batch_sequences)

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        prompts = PromptCache()
        for batch in batches:
            loss, _ = micro_batch_loss(cfg, model, batch, norms, prompts=prompts)
            loss.backward()
        prompts.backward(model)

    seconds = []
    for _ in range(args.repeats + 1):  # the first allocates AdamW's state
        start = time.perf_counter()
        update()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    torch.save({name: p.grad for name, p in model.named_parameters()}, args.gradients)
    prompt_positions = args.groups * (args.prompt_tokens - 1) if carry else 0
    return {"positions": sum(b.num_positions for b in batches) + prompt_positions,
            "micro_batches": len(batches), "seconds": statistics.median(seconds[1:]),
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def gradient_gap(first: str, second: str) -> float:
    import torch

    a, b = torch.load(first), torch.load(second)
    largest = max(float(t.abs().max()) for t in a.values() if t is not None)
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k] is not None) / largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=117)
    parser.add_argument("--response-tokens", type=int, default=141)
    parser.add_argument("--micro-batch-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", choices=["in rows", "carried"], help=argparse.SUPPRESS)
    parser.add_argument("--gradients", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = {}
    with tempfile.TemporaryDirectory(prefix="carried-prompts-") as folder:  # the gradients: 0.5 GB each
        for variant in ("in rows", "carried"):
            gradients = str(Path(folder) / f"{variant.replace(' ', '_')}.pt")
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant,
                                  "--gradients", gradients], check=True, capture_output=True, text=True).stdout
            rows[variant] = json.loads(out.strip().splitlines()[-1])
        gap = gradient_gap(str(Path(folder) / "in_rows.pt"), str(Path(folder) / "carried.pt"))
    base = rows["in rows"]
    print(f"\nOne GRPO update, {args.model}, {args.groups} prompts x {args.group_size} samples, "
          f"{args.prompt_tokens}-token prompts, {args.micro_batch_tokens}-token micro-batches, {args.threads} threads (median of {args.repeats})\n")
    print("| variant | positions run | micro-batches | update | peak RSS | update vs in rows |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['positions']:,} | {row['micro_batches']} | {row['seconds']:.2f} s | "
              f"{row['peak_mib']:,.0f} MiB | {row['seconds'] / base['seconds']:.2f}x |")
    print(f"\ngradients: largest difference {gap:.1e} of the largest entry (float32 sums in another order)")


if __name__ == "__main__":
    main()
