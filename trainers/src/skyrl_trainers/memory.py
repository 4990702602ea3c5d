"""Process-level memory settings for CPU training.

glibc gives every thread that allocates its own malloc arena, and memory freed in one arena is not
reused by another. The ``hf`` engine decodes on its own thread, so the engine's freed KV caches and
logits stayed resident beside the trainer's activations. One arena for the process lowered the peak
RSS of a GRPO step of SmolLM2-135M on CPU from about 4.2 GB to 3.8 GB (8 prompts x 4 samples x 64
tokens, measured); the tensors are large, so the single arena's lock costs nothing measurable.
:func:`fix_malloc_thresholds` keeps the rollout's large buffers out of that arena's heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)
# mallopt parameter numbers, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 4 * 2**20
TRIM_THRESHOLD = 64 * 2**20
ONEDNN_CACHE_CAPACITY = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
IDEEP_CACHE_CAPACITY = "LRU_CACHE_CAPACITY"  # torch's oneDNN wrapper (ideep) keeps its own cache


def use_one_malloc_arena() -> bool:
    """Limit glibc malloc to one arena for threads created from now on; False where that is not glibc."""
    return _mallopt(M_ARENA_MAX, 1)


def fix_malloc_thresholds(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Serve every allocation of at least ``mmap_threshold`` bytes from a mapping of its own, for the rest
    of the process, unless the user tuned glibc's thresholds; False where that was not done.

    glibc starts at 128 KiB and raises the threshold to the size of each mapped block that is freed (up
    to 32 MiB). The rollout frees its KV-cache layers (14 MB each at 32 rows of the main job) early, so
    from then on everything smaller came from the heap: the engine's caches and prefill activations left
    holes there that stayed resident, and each update spread its activations over them. With the
    threshold fixed at 4 MiB a micro-batch's activations (at most about 3 MB each at 512 tokens) still
    reuse the heap, while the rollout's buffers are mapped and unmapped whole. Three steps of the main
    job peaked at 3.65 to 3.70 GiB this way against 3.80 to 3.98 GiB with glibc's rule, at the same
    speed, and three seeds of the whole main job at 3.75 to 3.81 GiB against 3.93 to 4.28. Fixing it also stops glibc's own trim threshold (twice the mmap threshold) from following;
    ``trim_threshold`` keeps up to 64 MiB free at the top of the heap, as that rule does at most: a low
    one gives memory back and faults it in again all the time (with 8 MiB, the three steps' training
    took 129 s against about 100). A larger model's activations above 4 MiB get fresh pages each time.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(name in tunables for name in ("mmap_threshold", "trim_threshold")) or any(
            name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    return _mallopt(M_MMAP_THRESHOLD, mmap_threshold) and _mallopt(M_TRIM_THRESHOLD, trim_threshold)


def _mallopt(parameter: int, value: int) -> bool:
    """glibc's ``mallopt(parameter, value)``; False where the C library is not glibc or refuses it."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or not getattr(libc, "gnu_get_libc_version", None):
        return False
    ok = bool(mallopt(parameter, value))
    if not ok:
        log.debug("mallopt(%d, %d) was refused", parameter, value)
    return ok


def bound_onednn_primitive_cache(capacity: int = 64) -> None:
    """Keep at most ``capacity`` oneDNN primitives cached (oneDNN's default is 1024), and as many entries
    in the cache of torch's oneDNN wrapper, ideep (also 1024 by default), unless the user set
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` or ``LRU_CACHE_CAPACITY``. Effective only before the first use.

    CPU bf16 matmuls run as oneDNN primitives, each built for one problem shape and cached with its
    compiled kernels. Training micro-batches and prefills come in ever new lengths, so the cache grew
    by a few MB per new shape all run long: the main job's resident memory rose by about 0.3 GiB a step
    while its live tensors stayed at 1.5 GiB. Building a primitive takes about 0.3 ms, and the layers
    of one forward or backward share their few shapes, so a small cache costs no measurable time.
    ideep's cache grew the same way in bf16, by about 0.1 GiB of heap a step: four isolated updates of
    the main job's shape (an AVX512-BF16 CPU without AMX) peaked at 3.79 and 3.83 GiB with 64 entries,
    4.04 GiB and rising with 1024, and updates 2 to 4 took 73 and 75 s against 87 s.
    """
    os.environ.setdefault(ONEDNN_CACHE_CAPACITY, str(capacity))
    os.environ.setdefault(IDEEP_CACHE_CAPACITY, str(capacity))
