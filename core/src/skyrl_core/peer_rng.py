"""Other libraries' randomness, kept off the process's: for bridges whose peer draws from the global RNGs.

Many env libraries (game collections, procedural generators) call ``random.randint`` or ``np.random.rand``
directly, so two episodes interleaved on one process would draw from one stream, a seed would not repeat an
episode, and the trainer's own draws would shift. :class:`EpisodeRng` gives each episode its own global
``random`` and ``numpy.random`` states, installed only while peer code runs; :func:`global_rng_kept` only
puts the process's states back. Both hold one process-wide lock, since the global RNG is one per process.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy

_LOCK = threading.RLock()


def _states() -> tuple[Any, Any]:
    return random.getstate(), numpy.random.get_state()


def _restore(states: tuple[Any, Any]) -> None:
    random.setstate(states[0])
    numpy.random.set_state(states[1])


@contextmanager
def global_rng_kept() -> Iterator[None]:
    """Run peer code under the process-wide peer lock and put the global RNG states back afterwards.

    Reentrant: inside :meth:`EpisodeRng.active` it undoes what the enclosed code drew (trying a move on a
    copy of a game without using up the episode's randomness).
    """
    with _LOCK:
        saved = _states()
        try:
            yield
        finally:
            _restore(saved)


class EpisodeRng:
    """One episode's own global ``random`` and ``numpy.random`` states, seeded from ``seed``.

    ``with rng.active():`` installs them for the peer, keeps what the peer drew for the episode's next
    call, and puts the process's states back, so the same seed replays the same episode whatever else
    the process draws in between.
    """

    def __init__(self, seed: int) -> None:
        self._states = (random.Random(seed).getstate(), numpy.random.RandomState(seed % 2**32).get_state())

    @contextmanager
    def active(self) -> Iterator[None]:
        with _LOCK:
            saved = _states()
            _restore(self._states)
            try:
                yield
            finally:
                self._states = _states()
                _restore(saved)
