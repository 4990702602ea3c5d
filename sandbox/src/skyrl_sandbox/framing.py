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
import re
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
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def encode(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode("ascii")
    return HEADER.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader, max_bytes: int) -> dict[str, Any]:
    try:
        (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
        if size > max_bytes:
            raise ProtocolViolation(f"a message of {size:,} bytes exceeds the limit of {max_bytes:,} bytes")
        payload = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise WorkerGone("the worker closed its channel") from exc
    return decode(payload)


def decode(payload: bytes) -> dict[str, Any]:
    """The message in a frame's payload (for callers that read frames themselves, e.g. synchronously)."""
    if len(payload) >= _CHECK_FROM_BYTES:
        check_structure(payload)
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"a message is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolViolation("a message is not an object with an 'op' field")
    return message


def check_structure(payload: bytes) -> None:
    """Refuse JSON with more containers, items or nesting than a real message needs (linear time)."""
    skeleton = _STRINGS.sub(b'""', payload)  # brackets and commas inside strings are text, not structure
    containers = skeleton.count(b"[") + skeleton.count(b"{")
    if containers > MAX_CONTAINERS:
        raise ProtocolViolation(f"a message holds {containers:,} objects and lists, over the limit of "
                                f"{MAX_CONTAINERS:,}")
    items = skeleton.count(b",")
    if items > MAX_ITEMS:
        raise ProtocolViolation(f"a message holds {items:,} items, over the limit of {MAX_ITEMS:,}")
    depth = 0
    for bracket in _BRACKETS.finditer(skeleton):  # at most 2 * MAX_CONTAINERS matches
        depth += 1 if bracket.group() in (b"[", b"{") else -1
        if depth > MAX_DEPTH:
            raise ProtocolViolation(f"a message nests deeper than {MAX_DEPTH} levels")


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
