"""A box: one-shot commands with capped output and time limits, and files copied in and out."""

from __future__ import annotations

import pytest
from sandbox_helpers import signal_masks
from skyrl_sandbox import SandboxError
from skyrl_sandbox.box import Box, run


async def test_a_command_reports_exit_code_and_both_streams(box):
    result = await box.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not (result.stdout_truncated or result.stderr_truncated or result.timed_out)


async def test_commands_start_with_default_signals_whatever_this_process_ignores(host_ignores_interrupts, backend,
                                                                                 limits):
    async with await Box.create(backend, limits) as box:  # its worker starts while this process ignores SIGINT
        status = await box.run(["cat", "/proc/self/status"])
    assert signal_masks(status.stdout.decode()) == {"SigIgn": 0, "SigBlk": 0}


async def test_stdin_reaches_the_command(box):
    result = await box.run(["wc", "-c"], stdin=b"x" * 300_000)
    assert result.ok and result.stdout.strip() == b"300000"


async def test_files_copied_in_are_seen_by_commands_and_their_output_copied_out(box):
    await box.write_file("src/data.txt", b"hello\n")
    result = await box.run(["sh", "-c", "tr a-z A-Z < src/data.txt > out.txt"])
    assert result.ok
    assert await box.read_file("out.txt") == b"HELLO\n"
    assert (await box.run(["cat", "data.txt"], cwd="src")).stdout == b"hello\n"


async def test_the_work_directory_persists_across_commands(box):
    await box.run(["sh", "-c", "echo 41 > n"])
    assert (await box.run(["sh", "-c", "echo $(( $(cat n) + 1 ))"])).stdout == b"42\n"


async def test_output_past_the_cap_is_dropped_and_flagged(box):
    result = await box.run(["sh", "-c", "head -c 1000000 /dev/zero; head -c 10 /dev/zero >&2"], max_output_bytes=1000)
    assert result.stdout == b"\0" * 1000 and result.stdout_truncated
    assert result.stderr == b"\0" * 10 and not result.stderr_truncated


async def test_a_command_past_its_time_limit_is_killed_with_its_children(box):
    result = await box.run(["sh", "-c", "sleep 60 & sleep 60"], timeout_s=0.5)
    assert result.timed_out and result.exit_code == -9
    assert (await box.run(["sh", "-c", "echo alive"])).stdout == b"alive\n"


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x"])
async def test_file_paths_must_stay_inside_the_work_directory(box, path):
    with pytest.raises(SandboxError, match="outside the work directory"):
        await box.write_file(path, b"x")
    with pytest.raises(SandboxError, match="outside the work directory"):
        await box.read_file(path)


async def test_reading_a_file_larger_than_asked_is_an_error(box):
    await box.write_file("big", b"x" * 5000)
    with pytest.raises(SandboxError, match="larger than max_bytes=100"):
        await box.read_file("big", max_bytes=100)


async def test_bad_argv_is_a_clear_error(box):
    with pytest.raises(SandboxError, match="argv must be a non-empty list of strings"):
        await box.run([])
    missing = await box.run(["definitely-not-a-command"])
    assert missing.exit_code == 127 and b"definitely-not-a-command: No such file or directory" in missing.stderr


async def test_one_shot_run_closes_its_box(backend):
    result = await run(["sh", "-c", "echo once"], backend=backend)
    assert result.stdout == b"once\n"


async def test_a_closed_box_refuses_requests(backend):
    box = await Box.create(backend)
    await box.close()
    with pytest.raises(SandboxError, match="closed"):
        await box.run(["true"])
