"""Parent side of the worker protocol: 4-byte big-endian length + JSON, and validation.

Everything read from the worker is hostile: frames have a size limit, must decode to the expected
shape, and text is cut to its limit and cleaned of lone surrogates before anyone else sees it.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

HEADER = struct.Struct(">I")


class ProtocolViolation(Exception):
    """The worker sent something that is not a valid message."""


class WorkerGone(Exception):
    """The worker's channel closed: the process exited or closed its end."""


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
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolViolation(f"a message is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolViolation("a message is not an object with an 'op' field")
    return message


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
