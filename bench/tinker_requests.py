"""What one request costs the skyrl-tinker server before it is answered: peak RSS and the stall it causes
everyone else, for the largest valid ``forward_backward`` and the worst hostile bodies, against a
one-datum request measured in the same run.

Each request goes to a fresh ``skyrl-tinker serve`` process (so its peak RSS, the kernel's ``VmHWM``,
is that request's alone); a second client pings ``/healthz`` every 10 ms while the request is decoded
and answered, and the slowest ping is the stall the request caused (a body parsed on the event loop
holds up every other client for as long as it takes).

    python bench/tinker_requests.py                  # tiny-random, CPU
    python bench/tinker_requests.py --datums 256     # a smaller largest valid batch (it trains, on CPU)
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import zstandard
from skyrl_tinker import wire
from tinker_server import server_process

PROTOBUF = {"content-type": "application/x-protobuf", "content-encoding": "zstd"}


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set so far (``VmHWM``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc: Linux only")


def protobuf_batch(model_id: str, datums: int, tokens: int, hostile: bool = False) -> bytes:
    """A zstd ``ForwardBackwardRequest`` of ``datums`` x ``tokens`` token ids (cross_entropy): random ids with
    their targets, or (``hostile``) one id repeated and no targets, which compresses a thousandfold (300, above the small ints Python caches)."""
    message = wire._CLASSES["ForwardBackwardRequest"](model_id=model_id, loss_fn="cross_entropy")
    rng = np.random.default_rng(0)
    for _ in range(datums):
        datum = message.data.add()
        ids = np.full(tokens + 1, 300) if hostile else rng.integers(10, 500, size=tokens + 1)  # 300: no cached int
        datum.model_input.add().encoded_text.tokens = ids[:-1].astype(np.int32).tobytes()
        if not hostile:
            target = datum.loss_fn_inputs["target_tokens"]
            target.dtype, target.dense = wire.DTYPE_INT64, ids[1:].astype(np.int64).tobytes()
            target.shape.append(tokens)
    return zstandard.ZstdCompressor(level=3).compress(message.SerializeToString())


def json_batch(model_id: str, tokens: int) -> bytes:
    """A plain JSON ``forward_backward`` of one datum of ``tokens`` ids (refused past the context)."""
    return json.dumps({"model_id": model_id, "forward_backward_input": {"loss_fn": "cross_entropy", "data": [
        {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [7] * tokens}]},
         "loss_fn_inputs": {"target_tokens": {"data": [7] * 3, "dtype": "int64", "shape": [3]}}}]}}).encode()


def measure(args: argparse.Namespace, build: Callable[[str], tuple[bytes, dict[str, str]]]) -> dict[str, float]:
    """One request on a fresh server: its answer's status, wall time, peak-RSS growth and the slowest ping."""
    with server_process(args.base_model, "cpu") as (url, process), httpx.Client(base_url=f"{url}/api/v1",
                                                                                  timeout=3600) as http:
        session = http.post("/create_session", json={"sdk_version": "bench"}).json()["session_id"]
        created = http.post("/create_model", json={"session_id": session, "base_model": args.base_model,
                                                   "lora_config": {"rank": 8, "seed": 0}}).json()
        settle(http, created["request_id"])
        body, headers = build(created["model_id"])
        before = peak_rss_mb(process.pid)
        stop, pings = threading.Event(), []
        pinger = threading.Thread(target=ping, args=(url, stop, pings))
        pinger.start()
        start = time.perf_counter()
        response = http.post("/forward_backward", content=body, headers=headers)
        status = response.status_code
        if status == 200:
            status = settle(http, response.json()["request_id"])
        seconds = time.perf_counter() - start
        stop.set()
        pinger.join()
        return {"status": status, "body_kb": len(body) / 1024, "seconds": seconds,
                "rss_mb": peak_rss_mb(process.pid) - before, "stall_ms": 1000 * max(pings, default=0.0)}


def settle(http: httpx.Client, request_id: str) -> int:
    """Poll a queued request until it is done: 200, or 400 when it failed."""
    while True:
        answer = http.post("/retrieve_future", json={"request_id": request_id})
        if answer.headers.get("content-type") != "application/json":
            return 200
        data = answer.json()
        if data.get("type") != "try_again":
            return 400 if "error" in data else 200


def ping(url: str, stop: threading.Event, pings: list[float]) -> None:
    with httpx.Client(timeout=60) as other:
        while not stop.is_set():
            start = time.perf_counter()
            other.get(f"{url}/api/v1/healthz")
            pings.append(time.perf_counter() - start)
            stop.wait(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="tiny-random")
    parser.add_argument("--datums", type=int, default=1024, help="datums of the largest valid batch (the server's "
                        "default --max-batch-datums is 1024)")
    parser.add_argument("--context", type=int, default=2048, help="the model's context (tiny-random: 2048)")
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[str], tuple[bytes, dict[str, str]]]]] = [
        ("one datum of 64 tokens (baseline)", lambda m: (protobuf_batch(m, 1, 64), PROTOBUF)),
        (f"largest valid: {args.datums} x {args.context} tokens",
         lambda m: (protobuf_batch(m, args.datums, args.context), PROTOBUF)),
        ("hostile: 128 MiB of token ids, one datum", lambda m: (protobuf_batch(m, 1, 32 << 20, True), PROTOBUF)),
        ("hostile: 60 MiB of token ids, one datum", lambda m: (protobuf_batch(m, 1, 15 << 20, True), PROTOBUF)),
        ("hostile: 1024 datums of 2049 tokens", lambda m: (protobuf_batch(m, 1024, args.context + 1, True), PROTOBUF)),
        ("hostile: JSON, 4 M token ids", lambda m: (json_batch(m, 3_999_000), {"content-type": "application/json"})),
    ]
    rows = [(name, measure(args, build)) for name, build in cases]
    base = rows[0][1]
    print(f"\nskyrl-tinker: what one forward_backward request costs ({args.base_model}, CPU, a fresh server each)")
    print(f"{'request':<44}{'status':>7}{'body kB':>10}{'s':>8}{'peak RSS +MB':>14}{'x base':>8}{'stall ms':>10}")
    for name, row in rows:
        print(f"{name:<44}{row['status']:>7}{row['body_kb']:>10.1f}{row['seconds']:>8.2f}{row['rss_mb']:>14.1f}"
              f"{row['rss_mb'] / max(base['rss_mb'], 1.0):>8.1f}{row['stall_ms']:>10.1f}")


if __name__ == "__main__":
    main()
