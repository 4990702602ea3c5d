"""What the Tinker front door costs: the skyrl-tinker server driven by the real ``tinker`` client,
beside the same work called directly on our backend and engine in the same run.

Round trip at batch 32 (best of ``--reps``, the two sides measured alternately). The server runs as
users run it, ``skyrl-tinker serve`` in its own process; the direct side runs in this process on a
``Backend`` and an engine built the way the server builds its own:
  * forward_backward: 32 datums of ``--seq-len`` tokens, cross_entropy, through the client
    (protobuf + zstd body, futures polled) vs ``Backend.forward_backward`` on the same batch;
  * sample: 32 prompts x 1 sample, ``--max-tokens`` new tokens (several values: the client's cost is
    per request, the engine's grows with the length), seeded, through the client (32 concurrent
    ``sample`` futures) vs 32 concurrent ``generate`` calls on the engine.
Throughput with 1, 4 and 16 concurrent clients (each its own ServiceClient and LoRA adapter, in its
own thread; the server in this process, to count how many requests each backend call merged): every
client runs ``--steps`` x (forward_backward on 8 datums + optim_step); datums per second over all
clients, and the ratio to one client.

    python bench/tinker_server.py                          # tiny-random, CPU
    python bench/tinker_server.py --base-model smollm2-135m --seq-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_alternating(reps: int, direct: Callable[[], object], served: Callable[[], object]) -> tuple[float, float]:
    """Best of ``reps`` for each side, after one warm-up call each, measured direct, served, direct, ..."""
    direct()
    served()
    times = [(timed(direct), timed(served)) for _ in range(reps)]
    return min(d for d, _ in times), min(s for _, s in times)


@contextlib.contextmanager
def server_process(base_model: str, device: str) -> Iterator[str]:
    """``skyrl-tinker serve`` on a free loopback port; yields its URL once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(Path(sys.executable).with_name("skyrl-tinker")), "serve", "--base-model", base_model,
               "--device", device, "--port", str(port), "--checkpoint-dir", tempfile.mkdtemp(prefix="tinker-bench-")]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"skyrl-tinker serve exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("skyrl-tinker serve did not answer within 600 s")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=5).close()
                break
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def round_trips(args: argparse.Namespace, url: str) -> list[tuple[str, float, float]]:
    import tinker
    from skyrl_core.engine import SamplingParams
    from skyrl_tinker.backend import AdapterSpec, Backend
    from skyrl_tinker.sampler import build_sampler_engine
    from skyrl_tinker.wire import DatumIn
    from tinker import types

    rng = np.random.default_rng(0)
    backend = Backend(args.base_model, device=args.device)
    backend.create("direct", AdapterSpec(rank=8, seed=0))
    vocab = min(backend.vocab_size, 30000)
    seqs = [rng.integers(10, vocab, size=args.seq_len + 1).tolist() for _ in range(args.batch)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs={"target_tokens": s[1:]})
            for s in seqs]
    direct_data = [DatumIn(s[:-1], {"target_tokens": np.asarray(s[1:], np.int64)}) for s in seqs]
    prompts = [rng.integers(10, vocab, size=16).tolist() for _ in range(args.batch)]

    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    client = service.create_lora_training_client(base_model=args.base_model, rank=8, seed=0).result()
    rows = [("forward_backward, batch 32", *best_alternating(
        args.reps, lambda: backend.forward_backward("direct", direct_data, "cross_entropy", None),
        lambda: client.forward_backward(data, "cross_entropy").result()))]

    sampler = client.save_weights_and_get_sampling_client().result()  # LoRA B = 0: the base model's output
    engine = build_sampler_engine("hf", args.base_model, device=args.device)
    try:
        for max_tokens in [int(n) for n in args.max_tokens.split(",")]:
            params = types.SamplingParams(max_tokens=max_tokens, seed=0)
            engine_params = SamplingParams(max_tokens=max_tokens, seed=0)

            async def direct_sample(engine_params: SamplingParams = engine_params) -> None:
                await asyncio.gather(*(engine.generate(p, engine_params) for p in prompts))

            def via_server_sample(params: types.SamplingParams = params) -> None:
                futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
                for f in futures:
                    f.result()

            rows.append((f"sample 32 x {max_tokens} tokens",
                         *best_alternating(args.reps, lambda: asyncio.run(direct_sample()), via_server_sample)))
    finally:
        engine.close()
        service.close("success")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-model", default="tiny-random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--max-tokens", default="16,64", help="Comma-separated sample lengths.")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--clients", default="1,4,16")
    args = parser.parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")

    from skyrl_tinker.app import ServerConfig
    from skyrl_tinker.local import LocalServer

    with server_process(args.base_model, args.device) as url:
        rows = round_trips(args, url)
    print(f"\nskyrl-tinker round trip ({args.base_model}, {args.device}, seq len {args.seq_len}, best of {args.reps}, "
          "server in its own process)")
    print(f"{'operation':<28}{'direct s':>10}{'server s':>10}{'overhead':>10}")
    for name, d, s in rows:
        print(f"{name:<28}{d:>10.3f}{s:>10.3f}{(s / d - 1) * 100:>9.1f}%")

    print(f"\nthroughput, {args.steps} x (forward_backward 8 datums + optim_step) per client")
    print(f"{'clients':>8}{'datums/s':>12}{'vs 1':>8}{'batched':>10}")
    rng = np.random.default_rng(1)
    server = LocalServer(ServerConfig(base_model=args.base_model, device=args.device,
                                      checkpoint_dir=tempfile.mkdtemp(prefix="tinker-bench-")))
    try:
        vocab = min(server.service.backend.vocab_size, 30000)
        seqs = [rng.integers(10, vocab, size=args.seq_len + 1).tolist() for _ in range(8)]
        base_rate = None
        for n in [int(c) for c in args.clients.split(",")]:
            rate, merged = throughput(server, args.base_model, n, args.steps, seqs)
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
