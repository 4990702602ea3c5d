"""Admission control for async training: how many more task groups may start generating now (after AReaL).

The trainer's policy ``version`` is the number of steps trained. Each step trains ``batch_size``
groups, so groups that start while the version is ``v`` and are trained within ``max_staleness``
versions must fit in ``(max_staleness + v + 1) * batch_size`` groups counted since the start, less those
already accepted (trained), waiting in the buffer or still generating; dropped groups do not count.
At most ``max_concurrent`` generate at once::

    capacity = min(max_concurrent - running,
                   (max_staleness + version + 1) * batch_size - (accepted + buffered + running))

Producers wait while ``capacity <= 0``. The bound holds in aggregate: a group much slower than the
others can still arrive staler than ``max_staleness``; the trainer checks each group when it takes it.
Invariant: ``submitted == accepted + dropped + running + buffered``.
"""

from __future__ import annotations

import asyncio


class StalenessManager:
    """Counts groups through submit -> generate -> buffer -> train/drop and gates new submissions."""

    def __init__(self, max_concurrent: int, batch_size: int, max_staleness: int, version: int = 0,
                 accepted: int | None = None) -> None:
        if max_concurrent < 1 or batch_size < 1 or max_staleness < 0:
            raise ValueError("max_concurrent and batch_size must be >= 1 and max_staleness >= 0")
        self.max_concurrent, self.batch_size, self.max_staleness = max_concurrent, batch_size, max_staleness
        self.version = version
        # a resumed run has trained ``version * batch_size`` groups (its earlier submissions are not replayed)
        self.accepted = version * batch_size if accepted is None else accepted
        self.submitted = self.accepted
        self.running = self.buffered = self.dropped = 0
        self._changed: asyncio.Event | None = None

    @property
    def capacity(self) -> int:
        staleness_room = ((self.max_staleness + self.version + 1) * self.batch_size
                          - (self.accepted + self.buffered + self.running))
        return min(self.max_concurrent - self.running, staleness_room)

    def check(self) -> None:
        """Raise if the counts stopped adding up (a bug, not a user error)."""
        total = self.accepted + self.dropped + self.running + self.buffered
        if self.submitted != total:
            raise AssertionError(f"staleness manager: submitted {self.submitted} != accepted {self.accepted} + "
                                 f"dropped {self.dropped} + running {self.running} + buffered {self.buffered}")

    async def acquire(self) -> None:
        """Wait for ``capacity > 0``, then count one group as submitted and running."""
        while self.capacity <= 0:
            changed = self._event()
            changed.clear()
            await changed.wait()
        self.submitted += 1
        self.running += 1

    def generated(self) -> None:
        """A running group finished generating and entered the buffer."""
        self.running -= 1
        self.buffered += 1
        self._notify()

    def taken(self, *, accepted: bool) -> None:
        """The trainer took a buffered group: trained (``accepted``) or dropped as too stale."""
        self.buffered -= 1
        if accepted:
            self.accepted += 1
        else:
            self.dropped += 1
        self._notify()

    def set_version(self, version: int) -> None:
        """The trainer finished a step: producers may get room."""
        self.version = version
        self._notify()

    def _event(self) -> asyncio.Event:
        if self._changed is None:  # created on the loop that waits
            self._changed = asyncio.Event()
        return self._changed

    def _notify(self) -> None:
        self.check()
        if self._changed is not None:
            self._changed.set()  # every waiter re-checks its capacity
