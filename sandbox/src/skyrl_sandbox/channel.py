"""A worker's framed channel driven from one thread, without an event loop.

For callers whose request is itself a blocking call (an env step running a query): a thread hop
per request onto an event loop would cost more than the request. Every wait has a deadline
(``poll``), writes never block (a worker that stops reading cannot hang the caller), and every
frame is checked like the asynchronous channel's (size cap, structure limits, shape).
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Any

from . import framing
from .demux import StreamDemux
from .errors import ProtocolViolation, WorkerGone

_CHUNK = 64 * 1024
_DRAIN_READS = 100  # has_unread_data() reads at most this many chunks of a container's stderr flood


class BlockingChannel:
    """Frames over a worker's pipes (``read_fd``, ``write_fd``) or one socket (both the same descriptor).

    ``demux`` splits a container's multiplexed attach stream; without it every byte read is the
    worker's stdout. Use from one thread at a time.
    """

    def __init__(self, read_fd: int, write_fd: int, max_message_bytes: int, demux: StreamDemux | None = None) -> None:
        self.max_message_bytes = max_message_bytes
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._demux = demux
        self._buffer = bytearray()  # stdout read but not yet returned as a frame
        os.set_blocking(write_fd, False)
        self._readable = select.poll()
        self._readable.register(read_fd, select.POLLIN)
        self._writable = select.poll()
        self._writable.register(write_fd, select.POLLOUT)

    def send(self, message: dict[str, Any], deadline: float) -> None:
        """Write one frame; TimeoutError when the worker has not taken it all by ``deadline`` (a ``monotonic`` time)."""
        data = memoryview(framing.encode(message))
        while data:
            try:
                data = data[os.write(self._write_fd, data):]
            except BlockingIOError:
                _wait(self._writable, deadline)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise WorkerGone("the worker closed its channel") from exc

    def receive(self, deadline: float,
                structure: tuple[int, int] = (framing.MAX_CONTAINERS, framing.MAX_ITEMS)) -> dict[str, Any]:
        """The next message; ``structure``: the most objects and lists, and items, it may hold."""
        (size,) = framing.HEADER.unpack(self._take(framing.HEADER.size, deadline))
        if size > self.max_message_bytes:
            raise ProtocolViolation(f"a message of {size:,} bytes exceeds the limit of "
                                    f"{self.max_message_bytes:,} bytes")
        return framing.decode(self._take(size, deadline), *structure)

    def has_unread_data(self) -> bool:
        """Whether the worker wrote anything nobody asked for (frames are read exactly, so any stdout byte is that)."""
        if self._demux is None:
            return bool(self._buffer) or framing.bytes_waiting(self._read_fd) > 0
        for _ in range(_DRAIN_READS):  # what is waiting may be stderr only
            if not framing.bytes_waiting(self._read_fd) or not self._read_some():
                break
        return bool(self._buffer) or self._demux.stdout_pending

    def _take(self, size: int, deadline: float) -> bytearray:
        """Exactly ``size`` bytes of stdout (already checked against the cap)."""
        while len(self._buffer) < size:
            _wait(self._readable, deadline)
            if not self._read_some(max(size - len(self._buffer), _CHUNK)):
                raise WorkerGone("the worker closed its channel")
        data = self._buffer[:size]
        del self._buffer[:size]
        return data

    def _read_some(self, most: int = _CHUNK) -> bool:
        """Read what is there (False at end of stream)."""
        try:
            data = os.read(self._read_fd, most)
        except BlockingIOError:
            return True  # a wake-up with nothing to read
        except ConnectionResetError:
            return False
        if not data:
            return False
        self._buffer += data if self._demux is None else self._demux.feed(data)
        return True


def _wait(poller: select.poll, deadline: float) -> None:
    """Wait until ``poller``'s descriptor is ready; TimeoutError at ``deadline``."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if poller.poll(math.ceil(remaining * 1000)):
            return
