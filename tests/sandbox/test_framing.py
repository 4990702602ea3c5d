"""The parent's reading of worker messages (hostile input), and the seccomp filter builder."""

from __future__ import annotations

import asyncio
import json
import struct
import tracemalloc

import pytest
from skyrl_sandbox import ProtocolViolation, WorkerGone
from skyrl_sandbox.framing import decode, encode, int_field, read_message, text_field
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


@pytest.mark.parametrize("payload, problem", [
    (b"[" * 200_000 + b"]" * 200_000, "objects and lists, over the limit of 10,000"),
    (b"[" * 5_000 + b"]" * 5_000 + b" " * 70_000, "nests deeper than 32 levels"),
    (b"[" + b"{}," * 30_000 + b"{}]", "objects and lists, over the limit of 10,000"),
    (b"[" + b"0," * 300_000 + b"0]", "items, over the limit of 200,000"),
])
async def test_json_that_would_decode_to_far_more_than_its_size_is_a_violation_not_a_crash(payload, problem):
    with pytest.raises(ProtocolViolation, match=problem):
        await read_message(reader_with(frame(payload)), len(payload))


def test_brackets_commas_and_quotes_inside_strings_are_text():
    # Far more brackets and commas than the limits allow, all inside strings: escaped quotes, runs of
    # backslashes of both parities, empty strings, and strings across the check's 64 KiB windows.
    texts = ['[{,"\\' * 40_000, "\\" * 65_537, '\\"[' * 30_000, '\\\\"]' * 20_000, "", "]" * 70_000]
    message = {"op": "result", "texts": texts + [""] * 5_000}
    assert decode(json.dumps(message).encode()) == message


@pytest.mark.parametrize("text", ["\\" * 65_535, "\\" * 65_536, 'x\\"' * 30_000, "\\"])
def test_structure_after_a_string_that_ends_in_escapes_is_counted(text):
    message = {"op": "result", "text": text, "rows": [[]] * 20_000}
    payload = json.dumps(message).encode()
    with pytest.raises(ProtocolViolation, match="objects and lists, over the limit of 10,000"):
        decode(payload)
    assert decode(payload, max_containers=20_002) == message  # a caller expecting that many rows says so


async def test_a_frame_of_millions_of_empty_strings_costs_the_parent_little_more_than_its_size():
    payload = b'{"op": "result", "rows": [' + b'"",' * 8_000_000 + b'""]}'  # 24 MB
    reader = asyncio.StreamReader(limit=2**20)

    async def feed():  # as a pipe transport does: a chunk at a time
        reader.feed_data(struct.pack(">I", len(payload)))
        for start in range(0, len(payload), 256 * 1024):
            reader.feed_data(payload[start:start + 256 * 1024])
            await asyncio.sleep(0)

    tracemalloc.start()
    try:
        feeding = asyncio.ensure_future(feed())
        with pytest.raises(ProtocolViolation, match="items, over the limit of 200,000"):
            await read_message(reader, len(payload))
        await feeding
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The frame itself and a few chunks: readexactly() held the frame twice, and a regex-based check
    # built lists of millions of pieces (1.4 GB here).
    assert peak < len(payload) + 4 * 2**20


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
