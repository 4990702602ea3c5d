"""Hostile commands in a box: each attack is contained with a clear result and the host stays unharmed.

The worker-level attacks (forged frames, scaffold tampering, policy bypass) are in the REPL suites
of skyrl-rlm-repl, which run on the same backends. Here the commands are shell programs, as a
terminal agent would run them. The ``subprocess`` backend is weaker by design (no namespaces): its
commands run as ``nobody`` under a root parent, which is what contains them there, so attacks that
only namespaces stop are asserted for the strong backends.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest
from skyrl_sandbox import Limits, SandboxError
from skyrl_sandbox.box import Box

REPO = Path(__file__).resolve().parents[2]
FAKE_KEY = "sk-fake-2b7e-do-not-leak"


def strong_only(backend: str) -> None:
    if backend == "subprocess":
        pytest.skip("the subprocess backend has no namespaces: only bwrap and docker promise this")


def needs_root_parent(backend: str) -> None:
    """The subprocess backend contains signals and private files by running commands as nobody."""
    if backend == "subprocess" and os.geteuid() != 0:
        pytest.skip("with a non-root parent, subprocess commands run as the same user (weaker backend)")


async def test_private_host_files_are_out_of_reach(box, backend, tmp_path):
    needs_root_parent(backend)
    secret = tmp_path / "id_rsa"
    secret.write_text("HOST-PRIVATE-KEY")
    secret.chmod(0o600)
    result = await box.run(["sh", "-c", f"cat {secret}; cat /etc/shadow"])
    assert b"HOST-PRIVATE" not in result.stdout and b"root:" not in result.stdout and result.exit_code != 0
    assert result.stderr.count(b"No such file") + result.stderr.count(b"Permission denied") == 2


async def test_the_repository_and_host_root_are_invisible(box, backend):
    strong_only(backend)
    result = await box.run(["sh", "-c", f"cat {REPO / 'pyproject.toml'}"])
    assert b"No such file" in result.stderr and b"[tool.pytest" not in result.stdout
    repo = await box.run(["ls", "-A", str(REPO)])
    assert repo.exit_code != 0 and b"No such file" in repo.stderr
    homes = await box.run(["sh", "-c", "ls -A /home 2>/dev/null"])
    assert not set(homes.stdout.split()) & {entry.encode() for entry in os.listdir("/home")}  # no host homes


async def test_the_parents_secrets_are_not_in_the_environment(backend, limits, monkeypatch):
    needs_root_parent(backend)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    async with await Box.create(backend, limits) as box:
        result = await box.run(["sh", "-c", f"env; cat /proc/{os.getpid()}/environ; cat /proc/$PPID/environ"])
    assert FAKE_KEY.encode() not in result.stdout + result.stderr


@pytest.mark.parametrize("target", ["/etc/pwned", "/usr/pwned", "REPO"])
async def test_writing_outside_the_work_directory_fails(box, backend, target):
    path = str(REPO / "pwned_by_box") if target == "REPO" else target
    result = await box.run(["sh", "-c", f"echo x > {path}"])
    assert result.exit_code != 0
    assert not Path(path).exists()


async def test_kernel_settings_under_proc_stay_read_only(box, backend):
    """The sandbox's uid maps to the host's (root in CI): a writable /proc/sys would hand model code the host
    (kernel.core_pattern names a program the kernel runs as root). The value written back is the one there."""
    strong_only(backend)
    script = "v=$(cat /proc/sys/kernel/core_pattern) && printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern"
    result = await box.run(["/bin/sh", "-c", script])
    assert result.exit_code != 0
    assert b"Read-only file system" in result.stderr or b"Permission denied" in result.stderr


async def test_no_network_reaches_a_host_loopback_server(box, backend):
    strong_only(backend)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bool] = []
    threading.Thread(target=lambda: accepted.append(bool(server.accept())), daemon=True).start()
    try:
        result = await box.run(["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"])
    finally:
        server.close()
    assert result.exit_code != 0 and b"Network is unreachable" in result.stderr + result.stdout or not accepted
    assert not accepted


async def test_a_fork_bomb_is_capped_and_nothing_outlives_it(box, backend):
    bomb = await box.run(["sh", "-c", "b() { b | b & }; b; sleep 1"], timeout_s=3)
    assert b"fork" in bomb.stderr.lower() or b"resource temporarily unavailable" in bomb.stderr.lower()
    after = await box.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"], timeout_s=10)
    assert after.ok
    if backend != "subprocess":  # own PID namespace: only the namespace's init, the agent, sh, ls and grep
        assert int(after.stdout) <= 5


async def test_a_memory_bomb_hits_the_memory_limit(box, backend):
    result = await box.run(["python3", "-c", "x = bytearray(8 * 1024**3)"], timeout_s=20)
    assert result.exit_code != 0 and b"MemoryError" in result.stderr


async def test_a_disk_bomb_stops_at_a_limit(box, backend):
    result = await box.run(["sh", "-c", "head -c 200000000 /dev/zero > big; echo status $?"], timeout_s=20)
    size = int((await box.run(["sh", "-c", "wc -c < big"])).stdout)
    assert size <= box.limits.max_file_size_mb * 2**20 and size <= box.limits.tmp_size_mb * 2**20
    assert b"status 0" not in result.stdout


async def test_an_output_flood_is_cut_and_stopped(box, backend):
    result = await box.run(["yes"], timeout_s=1, max_output_bytes=4096)
    assert result.timed_out and result.stdout_truncated and len(result.stdout) == 4096


async def test_signals_cannot_reach_the_parent(backend, limits):
    needs_root_parent(backend)
    async with await Box.create(backend, limits) as box:
        try:
            await box.run(["sh", "-c", f"kill -9 {os.getpid()} {os.getppid()}; kill -9 -1"])
        except SandboxError as exc:  # kill -1 may take the box's own agent with it: contained, and said so
            assert "broke down and was closed" in str(exc)
    async with await Box.create(backend, limits) as box:  # this process, and the machine, carry on
        assert (await box.run(["echo", "alive"])).stdout == b"alive\n"


async def test_commands_cannot_reach_the_agents_channel_or_memory(box, backend):
    probe = ("import os, glob\n"
             "agent = os.getppid()\n"
             "for path in [f'/proc/{agent}/fd/0', f'/proc/{agent}/fd/1', f'/proc/{agent}/mem']:\n"
             "    try:\n"
             "        open(path, 'wb').write(b'\\x00\\x00\\x00\\x02{}')\n"
             "        print('OPENED', path)\n"
             "    except OSError as exc:\n"
             "        print('refused', exc.errno)\n"
             "for fd in range(3, 64):\n"
             "    try:\n"
             "        os.write(fd, b'\\x00\\x00\\x00\\x02{}')\n"
             "        print('WROTE', fd)\n"
             "    except OSError:\n"
             "        pass\n")
    result = await box.run(["python3", "-c", probe])
    assert b"OPENED" not in result.stdout and b"WROTE" not in result.stdout, result.stdout
    assert (await box.run(["echo", "still in sync"])).stdout == b"still in sync\n"


async def test_a_command_that_kills_the_agent_closes_the_box_with_a_clear_error(backend):
    async with await Box.create(backend, Limits()) as box:
        with pytest.raises(SandboxError, match="broke down and was closed"):
            await box.run(["sh", "-c", f"kill -{int(signal.SIGKILL)} $PPID; sleep 5"], timeout_s=10)
