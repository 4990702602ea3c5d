"""The Docker Engine's multiplexed attach stream, split into stdout and a bounded stderr tail.

Each frame is an 8-byte header (stream, 0, 0, 0, size) and ``size`` bytes; frames may arrive cut
anywhere. Stderr is kept as a bounded tail, so a worker flooding it costs the parent no memory.
"""

from __future__ import annotations

import struct
from collections import deque

STREAM_HEADER = struct.Struct(">BxxxI")
STDOUT = 1
STDERR_TAIL_BYTES = 64 * 1024


class StreamDemux:
    """Feed it what the socket gives; it returns the stdout bytes and keeps the stderr tail in ``stderr``."""

    def __init__(self, stderr: deque[bytes]) -> None:
        self.stderr = stderr
        self._stderr_bytes = 0
        self._header = bytearray()
        self._stream = 0
        self._remaining = 0

    @property
    def stdout_pending(self) -> bool:
        """Whether part of a stdout frame has arrived and not been returned yet."""
        return bool(self._header) or (self._stream == STDOUT and self._remaining > 0)

    def feed(self, data: bytes) -> bytes:
        """The stdout part of ``data``."""
        stdout = bytearray()
        view = memoryview(data)
        while view:
            if not self._remaining:
                needed = STREAM_HEADER.size - len(self._header)
                self._header += view[:needed]
                view = view[needed:]
                if len(self._header) < STREAM_HEADER.size:
                    break
                self._stream, self._remaining = STREAM_HEADER.unpack(self._header)
                self._header.clear()
                continue
            chunk, view = view[:self._remaining], view[self._remaining:]
            self._remaining -= len(chunk)
            if self._stream == STDOUT:
                stdout += chunk
            else:
                self._keep_stderr(bytes(chunk))
        return bytes(stdout)

    def _keep_stderr(self, chunk: bytes) -> None:
        self.stderr.append(chunk[-STDERR_TAIL_BYTES:])
        self._stderr_bytes += len(self.stderr[-1])
        while self._stderr_bytes - len(self.stderr[0]) >= STDERR_TAIL_BYTES:
            self._stderr_bytes -= len(self.stderr.popleft())
