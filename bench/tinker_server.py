"""What the Tinker front door costs: the skyrl-tinker server driven by the real ``tinker`` client,
beside the same work called directly on our backend and engine in the same process.

Round trip at batch 32 (best of ``--reps``):
  * forward_backward: 32 datums of ``--seq-len`` tokens, cross_entropy, through the client
    (protobuf + zstd body, futures polled) vs ``Backend.forward_backward`` on the same batch;
  * sample: 32 prompts x 1 sample, ``--max-tokens`` new tokens, seeded, through the client (32
    concurrent ``sample`` futures) vs 32 concurrent ``HFEngine.generate`` calls on an engine built the
    same way as the server's.
Throughput with 1, 4 and 16 concurrent clients (each its own ServiceClient and LoRA adapter, in its
own thread): every client runs ``--steps`` x (forward_backward on 8 datums + optim_step); datums
per second over all clients, and the ratio to one client.

    python bench/tinker_server.py                          # tiny-random, CPU
    python bench/tinker_server.py --base-model smollm2-135m --seq-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np


def best_of(reps: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-model", default="tiny-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--clients", default="1,4,16")
    args = parser.parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")

    import tinker
    from skyrl_core.engine import SamplingParams
    from skyrl_tinker.app import ServerConfig
    from skyrl_tinker.local import LocalServer
    from skyrl_tinker.wire import DatumIn
    from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
    from skyrl_trainers.models import load_model_and_tokenizer
    from tinker import types

    rng = np.random.default_rng(0)
    server = LocalServer(ServerConfig(base_model=args.base_model, device=args.device,
                                      checkpoint_dir=tempfile.mkdtemp(prefix="tinker-bench-")))
    backend = server.service.backend
    vocab = min(backend.vocab_size, 30000)
    seqs = [rng.integers(10, vocab, size=args.seq_len + 1).tolist() for _ in range(args.batch)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs={"target_tokens": s[1:]})
            for s in seqs]
    direct_data = [DatumIn(s[:-1], {"target_tokens": np.asarray(s[1:], np.int64)}) for s in seqs]
    prompts = [rng.integers(10, vocab, size=16).tolist() for _ in range(args.batch)]
    params = types.SamplingParams(max_tokens=args.max_tokens, seed=0)
    rows = []
    try:
        service = tinker.ServiceClient(base_url=server.url, api_key="tml-bench")
        client = service.create_lora_training_client(base_model=args.base_model, rank=8, seed=0).result()

        def via_server_fb() -> None:
            client.forward_backward(data, "cross_entropy").result()

        def direct_fb() -> None:
            backend.forward_backward(client.model_id, direct_data, "cross_entropy", None)

        via_server_fb()  # warm up both paths
        server_fb = best_of(args.reps, via_server_fb)
        direct = server.service.worker.call(lambda b: best_of(args.reps, direct_fb))
        rows.append(("forward_backward, batch 32", direct, server_fb))

        sampler = client.save_weights_and_get_sampling_client().result()

        def via_server_sample() -> None:
            futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
            for f in futures:
                f.result()

        model, tokenizer = load_model_and_tokenizer(args.base_model, device=args.device)
        engine = HFEngine.from_model(model, tokenizer, HFEngineConfig(max_batch_size=64, batch_wait_ms=2.0,
                                                                      logprobs_mode="raw"))
        engine_params = SamplingParams(max_tokens=args.max_tokens, seed=0)

        async def direct_sample() -> None:
            await asyncio.gather(*(engine.generate(p, engine_params) for p in prompts))

        via_server_sample()
        server_sample = best_of(args.reps, via_server_sample)
        asyncio.run(direct_sample())
        direct_s = best_of(args.reps, lambda: asyncio.run(direct_sample()))
        engine.close()
        rows.append((f"sample 32 x {args.max_tokens} tokens", direct_s, server_sample))
        service.close("success")

        print(f"\nskyrl-tinker round trip ({args.base_model}, {args.device}, seq len {args.seq_len}, best of {args.reps})")
        print(f"{'operation':<28}{'direct s':>10}{'server s':>10}{'overhead':>10}")
        for name, d, s in rows:
            print(f"{name:<28}{d:>10.3f}{s:>10.3f}{(s / d - 1) * 100:>9.1f}%")

        print(f"\nthroughput, {args.steps} x (forward_backward 8 datums + optim_step) per client")
        print(f"{'clients':>8}{'datums/s':>12}{'vs 1':>8}{'batched':>10}")
        base_rate = None
        for n in [int(c) for c in args.clients.split(",")]:
            rate, merged = throughput(server, args.base_model, n, args.steps, seqs[:8])
            base_rate = base_rate or rate
            print(f"{n:>8}{rate:>12.1f}{rate / base_rate:>8.2f}{merged:>10.2f}")
    finally:
        server.stop()


def throughput(server, base_model: str, n: int, steps: int, seqs: list[list[int]]) -> tuple[float, float]:
    """Datums per second over ``n`` clients training at once; and requests merged per backend call."""
    import tinker
    from tinker import types

    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs={"target_tokens": s[1:]})
            for s in seqs]
    services = [tinker.ServiceClient(base_url=server.url, api_key="tml-bench") for _ in range(n)]
    clients = [s.create_lora_training_client(base_model=base_model, rank=8, seed=i).result()
               for i, s in enumerate(services)]
    barrier = threading.Barrier(n + 1)

    def work(client) -> None:
        barrier.wait()
        for _ in range(steps):
            client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=1e-4)).result()

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    sizes_before = len(server.service.worker.batch_sizes)
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    merged = server.service.worker.batch_sizes[sizes_before:]
    for s in services:
        s.close("success")
    return n * steps * len(data) / elapsed, statistics.fmean(merged) if merged else 0.0


if __name__ == "__main__":
    main()
