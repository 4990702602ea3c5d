"""The parent's reading of worker messages (hostile input), and the seccomp filter builder."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest
from skyrl_sandbox import ProtocolViolation, WorkerGone
from skyrl_sandbox.framing import encode, int_field, read_message, text_field
from skyrl_sandbox.seccomp import build_filter


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


async def test_round_trip_of_a_message():
    message = {"op": "result", "stdout": "héllo \ud800", "seq": 3}
    assert await read_message(reader_with(encode(message)), 1024) == message


@pytest.mark.parametrize("data, problem", [
    (struct.pack(">I", 2**31), "exceeds the limit of 1,024 bytes"),
    (frame(b"{oops"), "not valid JSON"),
    (frame(b"[1, 2]"), "not an object"),
    (frame(b'"just a string"'), "not an object"),
    (frame(b'{"no_op": 1}'), "'op' field"),
    (frame(b'{"op": 7}'), "'op' field"),
])
async def test_malformed_frames_are_violations(data, problem):
    with pytest.raises(ProtocolViolation, match=problem):
        await read_message(reader_with(data), 1024)


async def test_deeply_nested_json_is_a_violation_not_a_crash():
    payload = b"[" * 200_000 + b"]" * 200_000
    with pytest.raises(ProtocolViolation, match="200,000 objects and lists"):
        await read_message(reader_with(frame(payload)), len(payload))
    shallow_enough_to_count = b"[" * 5_000 + b"]" * 5_000 + b" " * 70_000
    with pytest.raises(ProtocolViolation, match="nests deeper than 32 levels"):
        await read_message(reader_with(frame(shallow_enough_to_count)), len(shallow_enough_to_count))


@pytest.mark.parametrize("data", [b"", b"\x00\x00", frame(b'{"op": "result"}')[:-3]])
async def test_a_channel_closed_mid_frame_means_the_worker_is_gone(data):
    with pytest.raises(WorkerGone):
        await read_message(reader_with(data), 1024)


def test_fields_are_type_checked_cut_and_cleaned():
    message = {"op": "result", "stdout": "x" * 100 + "\ud800", "seq": -1, "flag": True, "error": None}
    assert text_field(message, "stdout", 10) == "x" * 10
    assert text_field({"op": "r", "t": "a\ud800b"}, "t", 10) == "a?b"
    assert text_field(message, "error", 10) is None
    with pytest.raises(ProtocolViolation, match="'error' must be a string"):
        text_field(message, "error", 10, optional=False)
    with pytest.raises(ProtocolViolation, match="'seq' must be a non-negative integer"):
        int_field(message, "seq")
    with pytest.raises(ProtocolViolation, match="'flag' must be a non-negative integer"):
        int_field(message, "flag")


def test_messages_are_ascii_json():
    data = encode({"op": "x", "text": "é"})
    assert json.loads(data[4:]) == {"op": "x", "text": "é"} and data[4:].isascii()


def test_seccomp_filter_is_whole_instructions_and_only_for_known_machines():
    for machine in ("x86_64", "aarch64"):
        for allow in (False, True):
            program = build_filter(allow, machine=machine)
            assert program and len(program) % 8 == 0
        assert len(build_filter(False, machine=machine)) > len(build_filter(True, machine=machine))
        assert len(build_filter(False, own_pid=7, machine=machine)) > len(build_filter(False, machine=machine))
    assert build_filter(False, machine="sparc64") is None
