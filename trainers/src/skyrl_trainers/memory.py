"""Process-level memory settings for CPU training.

glibc gives every thread that allocates its own malloc arena, and memory freed in one arena is not
reused by another. The ``hf`` engine decodes on its own thread, so the engine's freed KV caches and
logits stayed resident beside the trainer's activations. One arena for the process lowered the peak
RSS of a GRPO step of SmolLM2-135M on CPU from about 4.2 GB to 3.8 GB (8 prompts x 4 samples x 64
tokens, measured); the tensors are large, so the single arena's lock costs nothing measurable.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h


def use_one_malloc_arena() -> bool:
    """Limit glibc malloc to one arena for threads created from now on; False where that is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or not getattr(libc, "gnu_get_libc_version", None):
        return False
    ok = bool(mallopt(M_ARENA_MAX, 1))
    if not ok:
        log.debug("mallopt(M_ARENA_MAX, 1) was refused")
    return ok
