"""Seeds for what requests leave unseeded, when the server is given one (``serve --seed``).

Without it, a sample request with no ``seed`` draws fresh randomness and a LoRA adapter with no
``seed`` starts from the process's random state, so two runs of the same training script differ.
With it, a sample request gets a seed derived from the server's seed, its prompt, its parameters
and how many identical requests came before (identical requests are interchangeable, so the
order in which concurrent ones arrive does not matter), and the n-th adapter created gets the
n-th adapter seed: the same script against a fresh server repeats itself. Both are counted per
tenant, so what one tenant sends never shifts the seeds another tenant's requests get.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict, defaultdict

from skyrl_core.engine import SamplingParams

_REMEMBERED = 65_536  # distinct requests of a tenant whose repeat count is kept (the oldest are forgotten first)
_SEED_BYTES = 7  # seeds below 2**56: sample i of a request uses seed + i, which must fit an int64


class ServerSeeds:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._seen: defaultdict[str, OrderedDict[bytes, int]] = defaultdict(OrderedDict)  # per tenant: none evicts another's counts
        self._adapters: Counter[str] = Counter()
        self._lock = threading.Lock()

    def for_sample(self, tenant: str, prompt: list[int], params: SamplingParams, num_samples: int) -> int:
        key = _digest(f"sample {self.seed} {tenant!r} {num_samples} {params.model_dump_json()} {prompt}".encode())
        with self._lock:
            seen = self._seen[tenant]
            repeat = seen.pop(key, 0)
            seen[key] = repeat + 1
            if len(seen) > _REMEMBERED:
                seen.popitem(last=False)
        return _seed(key + repeat.to_bytes(8, "big"))

    def for_adapter(self, tenant: str) -> int:
        with self._lock:
            number = self._adapters[tenant]
            self._adapters[tenant] += 1
        return _seed(f"adapter {self.seed} {tenant!r} {number}".encode())


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _seed(data: bytes) -> int:
    return int.from_bytes(_digest(data)[:_SEED_BYTES], "big")
