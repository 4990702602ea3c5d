"""Length-prefixed JSON frames over the worker's two pipe ends (worker side)."""

from __future__ import annotations

import json
import os
import struct
import threading

from . import kernel

HEADER = struct.Struct(">I")


class Channel:
    """Blocking send/receive of JSON messages.

    ``lock`` is held by whoever waits for a message (the idle worker loop, or a thread waiting for
    the answer to its sub-call request), so a reply is always read by the thread that expects it.
    """

    def __init__(self, read_fd: int, write_fd: int, max_message_bytes: int) -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        self.max_message_bytes = max_message_bytes
        self.lock = threading.RLock()

    def send(self, message: dict) -> None:
        payload = json.dumps(message).encode("ascii")  # ASCII escapes: valid even with lone surrogates
        if len(payload) > self.max_message_bytes:
            raise ValueError(f"message of {len(payload):,} bytes exceeds the sandbox limit of "
                             f"{self.max_message_bytes:,} bytes")
        data = memoryview(HEADER.pack(len(payload)) + payload)
        with self.lock:  # frames from several threads must never interleave
            while data:
                written = os.write(self._write_fd, data)
                data = data[written:]

    def receive(self) -> dict:
        (size,) = HEADER.unpack(self._read_exactly(HEADER.size))
        return json.loads(self._read_exactly(size).decode("utf-8"))

    def _read_exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = os.read(self._read_fd, min(size, 1 << 20))
            if not chunk:
                raise EOFError("the parent closed the channel")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


def connect(spawn_json: str) -> tuple[Channel, dict] | None:
    """A worker's first steps: take stdin/stdout over as the channel, die with the parent, say
    ``ready`` and return the parent's ``init`` message (None when the parent went away first)."""
    spawn = json.loads(spawn_json)
    channel = Channel(os.dup(0), os.dup(1), spawn["max_message_bytes"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)  # stray writes to fd 1 must never look like protocol frames
    kernel.die_with_parent(spawn.get("expected_parent_pid"))
    channel.send({"op": "ready", "pid": os.getpid()})
    try:
        return channel, channel.receive()
    except EOFError:
        return None
