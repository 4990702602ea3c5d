"""Parent side of the worker protocol: 4-byte big-endian length + JSON, and validation.

Everything read from the worker is hostile: frames have a size limit and a structure limit (so a
frame cannot cost the parent much more memory to decode than it has bytes), must decode to the
expected shape, and text is cut to its limit and cleaned of lone surrogates before anyone else
sees it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import struct
import termios
from typing import Any

from .errors import ProtocolViolation, WorkerGone

HEADER = struct.Struct(">I")
# Decoding a frame costs at most a few times its size when it holds few containers and items:
# tiny objects and lists ({} is 2 bytes on the wire, over 60 in memory) are what amplify.
MAX_CONTAINERS = 10_000
MAX_ITEMS = 200_000
MAX_DEPTH = 32
_CHECK_FROM_BYTES = 64 * 1024  # smaller frames cannot amplify to anything that matters
_WINDOW = 64 * 1024  # bytes the structure check copies and looks at at a time
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def encode(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode("ascii")
    return HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader, max_bytes: int) -> dict[str, Any]:
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    except asyncio.IncompleteReadError as exc:
        raise WorkerGone("the worker closed its channel") from exc
    if size > max_bytes:
        raise ProtocolViolation(f"a message of {size:,} bytes exceeds the limit of {max_bytes:,} bytes")
    # Read into one buffer: readexactly() would hold the frame twice (its buffer and the copy it returns).
    payload = bytearray(size)
    filled = 0
    with memoryview(payload) as view:
        while filled < size:
            chunk = await reader.read(size - filled)
            if not chunk:
                raise WorkerGone("the worker closed its channel")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    return decode(payload)


def decode(payload: bytes | bytearray, max_containers: int = MAX_CONTAINERS,
           max_items: int = MAX_ITEMS) -> dict[str, Any]:
    """The message in a frame's payload (for callers that read frames themselves, e.g. synchronously).

    A caller that expects bigger messages of a known shape (rows of a query result) passes limits
    derived from that shape.
    """
    if len(payload) >= _CHECK_FROM_BYTES:
        check_structure(payload, max_containers, max_items)
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"a message is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolViolation("a message is not an object with an 'op' field")
    return message


def check_structure(payload: bytes | bytearray, max_containers: int = MAX_CONTAINERS,
                    max_items: int = MAX_ITEMS) -> None:
    """Refuse JSON with more containers, items or nesting than a real message needs.

    One pass over the payload, a window at a time, stopping in the first window where a limit is
    exceeded; the memory it takes is a few windows, whatever the payload holds. Brackets and commas
    inside strings are text, not structure: per window, escaped backslashes and quotes are dropped,
    then the text between quotes is left out. For valid JSON the counts are exact; for anything
    else they describe the prefix json.loads reads before it fails.
    """
    containers = items = depth = 0
    in_string = escaped = False
    for start in range(0, len(payload), _WINDOW):
        window = payload[start + escaped:start + _WINDOW]  # skip a byte escaped by the last window's end
        window = window.replace(b"\\\\", b"")
        escaped = window.endswith(b"\\")
        window = window.replace(b'\\"', b"").replace(b'""', b"")  # in valid JSON, "" is an empty string
        parts = window.split(b'"')
        outside = b"".join(parts[in_string::2])
        in_string ^= len(parts) % 2 == 0
        containers += outside.count(b"[") + outside.count(b"{")
        if containers > max_containers:
            raise ProtocolViolation(f"a message holds at least {containers:,} objects and lists, over the limit of "
                                    f"{max_containers:,}")
        items += outside.count(b",")
        if items > max_items:
            raise ProtocolViolation(f"a message holds at least {items:,} items, over the limit of {max_items:,}")
        for bracket in outside.translate(None, _NOT_BRACKETS):  # at most 2 * max_containers in all
            depth += 1 if bracket in b"[{" else -1
            if depth > MAX_DEPTH:
                raise ProtocolViolation(f"a message nests deeper than {MAX_DEPTH} levels")
            if depth < 0:
                return  # not JSON: json.loads stops at this bracket


def expect(message: dict[str, Any], *ops: str) -> None:
    if message["op"] not in ops:
        raise ProtocolViolation(f"unexpected message {message['op'][:40]!r} (expected {' or '.join(ops)})")


def text_field(message: dict[str, Any], key: str, limit: int, optional: bool = True) -> str | None:
    value = message.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ProtocolViolation(f"field {key!r} must be a string, got {type(value).__name__}")
    return value[:limit].encode("utf-8", "replace").decode("utf-8")


def int_field(message: dict[str, Any], key: str) -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolViolation(f"field {key!r} must be a non-negative integer")
    return value


def bytes_waiting(fd: int) -> int:
    """Bytes readable now on a pipe or socket without blocking (0 once it is closed)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0
