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
Fair share (two tenants, server in this process): Bob's small request (one ``forward_backward`` datum;
one sample of ``--max-tokens``' first value) alone, then sent right after Alice queued a flood of N
requests (``--batch`` datums each; ``--batch``-sample requests); his wait as a ratio to his time alone.
Sampling sessions: the server's RSS after opening 1, then ``--sessions``, sampling sessions of one
checkpoint (a rank-32 adapter), and the growth.

    python bench/tinker_server.py                          # tiny-random, CPU
    python bench/tinker_server.py --base-model smollm2-135m --seq-len 64
    python bench/tinker_server.py --sections fair_share,sampling_sessions
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
def server_process(base_model: str, device: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``skyrl-tinker serve`` on a free loopback port; yields its URL and process once it answers."""
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
        yield url, process
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
    parser.add_argument("--floods", default="10,40", help="Comma-separated sizes of Alice's flood (fair share).")
    parser.add_argument("--sessions", type=int, default=150, help="Sampling sessions of one checkpoint (RSS).")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"Comma-separated, of {', '.join(SECTIONS)}.")
    args = parser.parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    for section in args.sections.split(","):
        SECTIONS[section](args)


def round_trip_table(args: argparse.Namespace) -> None:
    with server_process(args.base_model, args.device) as (url, _):
        rows = round_trips(args, url)
    print(f"\nskyrl-tinker round trip ({args.base_model}, {args.device}, seq len {args.seq_len}, best of {args.reps}, "
          "server in its own process)")
    print(f"{'operation':<28}{'direct s':>10}{'server s':>10}{'overhead':>10}")
    for name, d, s in rows:
        print(f"{name:<28}{d:>10.3f}{s:>10.3f}{(s / d - 1) * 100:>9.1f}%")


def throughput_table(args: argparse.Namespace) -> None:
    from skyrl_tinker.app import ServerConfig
    from skyrl_tinker.local import LocalServer

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


ALICE, BOB = "tml-bench-alice-0123456789", "tml-bench-bob-0123456789ab"


@contextlib.contextmanager
def two_tenants(args: argparse.Namespace, **config: object) -> Iterator:
    """A server in this process with tenants alice and bob; yields it and a ServiceClient each."""
    import tinker
    from skyrl_tinker.app import ServerConfig
    from skyrl_tinker.local import LocalServer

    server = LocalServer(ServerConfig(base_model=args.base_model, device=args.device, seed=0,
                                      checkpoint_dir=tempfile.mkdtemp(prefix="tinker-bench-"),
                                      api_keys={ALICE: "alice", BOB: "bob"}, **config))
    clients = [tinker.ServiceClient(base_url=server.url, api_key=key) for key in (ALICE, BOB)]
    try:
        yield server, *clients
    finally:
        for client in clients:
            client.close("success")
        server.stop()


def behind_flood(server, route: str, body: dict, n: int, small: Callable[[], object]) -> tuple[float, float]:
    """Seconds ``small()`` takes once Alice queued ``n`` requests ``body`` on ``route`` (raw HTTP: a POST
    returns once its request is queued), and seconds until her whole flood is done."""
    import httpx

    start = time.perf_counter()
    with httpx.Client(base_url=f"{server.url}/api/v1", headers={"X-API-Key": ALICE}, timeout=60) as http:
        flood = [server.service.futures.get(http.post(route, json=body).json()["request_id"]) for _ in range(n)]
    waited = timed(small)
    while not all(future.done for future in flood):
        time.sleep(0.001)
    return waited, time.perf_counter() - start


def fair_share_table(args: argparse.Namespace) -> None:
    from tinker import types

    rng = np.random.default_rng(2)
    with two_tenants(args) as (server, alice, bob):
        vocab = min(server.service.backend.vocab_size, 30000)
        seqs = [rng.integers(10, vocab, size=args.seq_len + 1).tolist() for _ in range(args.batch)]
        trainers = [c.create_lora_training_client(base_model=args.base_model, rank=8, seed=0).result()
                    for c in (alice, bob)]
        samplers = [trainers[0].save_weights_and_get_sampling_client().result(),
                    bob.create_sampling_client(base_model=args.base_model).result()]
        datum = types.Datum(model_input=types.ModelInput.from_ints(seqs[0][:-1]),
                            loss_fn_inputs={"target_tokens": seqs[0][1:]})
        prompt = seqs[0][:16]
        params = {"max_tokens": int(args.max_tokens.split(",")[0]), "seed": 0}
        floods = {"forward_backward": ("/forward_backward", {
            "model_id": trainers[0].model_id, "seq_id": 1, "forward_backward_input": {"loss_fn": "cross_entropy", "data": [
                {"model_input": {"chunks": [{"type": "encoded_text", "tokens": s[:-1]}]},
                 "loss_fn_inputs": {"target_tokens": {"data": s[1:], "dtype": "int64", "shape": [len(s) - 1]}}}
                for s in seqs]}}),
            "sample": ("/asample", {"sampling_session_id": samplers[0]._sampling_session_id, "seq_id": 0,
                                    "num_samples": args.batch, "prompt": {"chunks": [
                                        {"type": "encoded_text", "tokens": prompt}]}, "sampling_params": params})}
        smalls = {"forward_backward": lambda: trainers[1].forward_backward([datum], "cross_entropy").result(),
                  "sample": lambda: samplers[1].sample(types.ModelInput.from_ints(prompt), 1,
                                                       types.SamplingParams(**params)).result()}
        print(f"\nfair share ({args.base_model}, {args.device}): Bob's one request behind Alice's flood of N "
              f"({args.batch} datums or samples each); alone: best of {args.reps} just before, behind and flood: "
              f"median of {args.reps}")
        print(f"{'request':<18}{'N':>5}{'alone s':>10}{'behind s':>10}{'ratio':>8}{'flood s':>10}")
        for kind, (route, body) in floods.items():
            smalls[kind]()
            for n in [int(f) for f in args.floods.split(",")]:
                alone = min(timed(smalls[kind]) for _ in range(args.reps))
                runs = [behind_flood(server, route, body, n, smalls[kind]) for _ in range(args.reps)]
                waited, total = (statistics.median(column) for column in zip(*runs, strict=True))
                print(f"{kind:<18}{n:>5}{alone:>10.3f}{waited:>10.3f}{waited / alone:>8.1f}{total:>10.3f}")


def rss_mb() -> float:
    """This process's resident memory, after handing freed heap back to the system (so that what an
    earlier section freed does not pass for a change here)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def held_mb(service) -> float:
    """The adapter weights the service's sampling sessions hold, each copy counted once."""
    copies = {id(s.weights): s.weights for s in list(service.sampling.values())}.values()
    return sum(t.numel() * t.element_size() for w in copies for t in w.adapter.values()) / 2**20


def sampling_sessions_table(args: argparse.Namespace) -> None:
    with two_tenants(args, max_sampling_sessions=args.sessions) as (server, alice, _):
        trainer = alice.create_lora_training_client(base_model=args.base_model, rank=32, seed=0).result()
        path = trainer.save_weights_for_sampler("rss").result().path
        rows = []
        for total in (1, args.sessions):
            while len(server.service.sampling) < total:
                alice.create_sampling_client(model_path=path).result()
            rows.append((total, held_mb(server.service), rss_mb()))
    print(f"\nsampling sessions of one checkpoint ({args.base_model}, rank-32 adapter of {rows[0][1]:.2f} MB)")
    print(f"{'sessions':>9}{'weights held MB':>17}{'RSS MB':>10}{'RSS growth MB':>15}")
    for total, held, rss in rows:
        print(f"{total:>9}{held:>17.2f}{rss:>10.1f}{rss - rows[0][2]:>15.1f}")


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "round_trip": round_trip_table, "throughput": throughput_table, "fair_share": fair_share_table,
    "sampling_sessions": sampling_sessions_table}


if __name__ == "__main__":
    main()
