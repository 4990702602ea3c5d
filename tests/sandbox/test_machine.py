"""The Machine API on every machine backend (bwrap, docker, podman): users, environment, exec, files, the shell,
cleanup.

Every test runs on a real machine of each backend this host has (skipped with the reason elsewhere,
failed under ``SKYRL_REQUIRE_<BACKEND>=1``). What runs in a machine is checked from the machine
itself: a root exec listing ``/proc`` (a container), the machine's cgroup (bwrap: every exec is a PID
namespace of its own, so no exec sees the shell's processes), and, as a second witness, this
host's ``/proc`` (the engine shares this kernel), each with a positive control first so that
"nothing found" means something.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path

import pytest
from sandbox_helpers import signal_masks
from skyrl_sandbox import SandboxError
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.machine import Machine, MachineSpec
from skyrl_sandbox.machine_factory import machine_backends, start_machine
from skyrl_sandbox.registry import get_backend
from skyrl_sandbox.testing import require_backend

SECRET_VARIABLE = "SKYRL_TEST_PARENT_SECRET"


def in_container(backend: str) -> bool:
    """Whether ``backend``'s machines are containers of an engine (docker, podman), not bwrap's."""
    return get_backend(backend).engine is not None


def engine_api(backend: str):
    """The Docker-API client of a container backend's engine."""
    return get_backend(backend).engine.shared_client().api


CONTAINER_BACKENDS = [name for name in machine_backends() if in_container(name)]


@pytest.fixture(params=machine_backends())
def machine_backend(request: pytest.FixtureRequest) -> str:
    """Each machine backend in turn, skipped (failed under SKYRL_REQUIRE_<BACKEND>=1) where it cannot run."""
    require_backend(request.param)
    if in_container(request.param):
        images.ensure_base_image(get_backend(request.param).engine)
    return request.param


def machine_spec(**overrides) -> MachineSpec:
    settings = {"image": images.BASE_TAG, "memory_mb": 512, "max_processes": 128, "storage_mb": 256, **overrides}
    return MachineSpec(**settings)


@pytest.fixture
async def machine(machine_backend: str, request: pytest.FixtureRequest):
    """A started machine of the backend, made from the test module's ``MACHINE_SPEC()`` (default: machine_spec())."""
    started = await start_machine(getattr(request.module, "MACHINE_SPEC", machine_spec)(), machine_backend)
    try:
        yield started
    finally:
        await started.close()


def marker() -> str:
    """A sleep duration no other process on this host has on its command line (``sleep <marker>``)."""
    return f"{secrets.randbelow(9000) + 30000}.{secrets.randbelow(10**8):08d}"


def host_processes(text: str) -> list[int]:
    """Live processes anywhere on this host whose command line holds ``text`` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


_LIST_PROCESSES = r'for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] || { tr "\0" " " < $p/cmdline; echo; }; done'


async def machine_processes(machine: Machine) -> str:
    """The command lines of the processes running in ``machine``, as the machine sees them."""
    cgroup = getattr(machine, "cgroup", None)
    if in_container(machine.backend):
        listed = await machine.exec(["sh", "-c", _LIST_PROCESSES], cwd="/", timeout_s=30, max_output_bytes=1 << 20)
        assert listed.ok, listed
        return listed.stdout.decode(errors="replace")
    assert cgroup is not None, f"no cgroup to look into: {machine.warnings}"
    lines = []
    for pid in (cgroup.dirs[0] / "cgroup.procs").read_text().split():
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(lines)


async def running(machine: Machine, *markers: str, settle_for: str = "gone") -> set[str]:
    """Which of ``markers`` a live process of ``machine`` (seen from the machine, and from this host) carries.

    Processes take a moment to start (a ``&`` job execs after the shell goes on) and to die (SIGKILL
    is delivered, then the process is reaped), so this looks again, a bounded number of times, until
    all are ``"gone"`` or all are ``"there"``, and answers what it saw last.
    """
    for _ in range(100):
        inside = await machine_processes(machine)
        seen = {m for m in markers if m in inside or host_processes(m)}
        if seen == (set() if settle_for == "gone" else set(markers)):
            break
        await asyncio.sleep(0.05)
    return seen


async def agent_sh(machine: Machine, script: str, **kwargs):
    return await machine.exec(["sh", "-c", script], user="agent", **kwargs)


# --- exec: users, environment, exit codes, stdin, output caps, time-outs ------------------------------------


async def test_exec_runs_as_root_or_as_the_agent_with_their_names_and_homes(machine):
    probe = 'id -u; id -g; id -un; echo "$HOME $USER $LOGNAME"; pwd'
    root = await machine.exec(["sh", "-c", probe])
    assert root.ok and root.stdout.decode().split("\n")[:5] == ["0", "0", "root", "/root root root", "/app"]
    agent = await agent_sh(machine, probe)
    assert agent.ok and agent.stdout.decode().split("\n")[:5] == ["1000", "1000", "agent", "/home/agent agent agent",
                                                                  "/app"]
    elsewhere = await agent_sh(machine, "pwd; touch mine && stat -c %u mine", cwd="/home/agent")
    assert elsewhere.stdout.split() == [b"/home/agent", b"1000"]


async def test_no_variable_of_this_process_reaches_the_machine(machine_backend, monkeypatch):
    secret = f"sk-test-{secrets.token_hex(12)}"
    monkeypatch.setenv(SECRET_VARIABLE, secret)
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    spec = machine_spec(env={"FROM_SPEC": "spec-value"})
    async with await start_machine(spec, machine_backend) as machine:
        for user in ("root", "agent"):
            result = await machine.exec(["sh", "-c", "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"],
                                        user=user, env={"GIVEN": "given-value"}, max_output_bytes=1 << 20)
            assert result.ok, result
            assert secret.encode() not in result.stdout and SECRET_VARIABLE.encode() not in result.stdout
            assert b"LD_PRELOAD" not in result.stdout
            assert b"FROM_SPEC=spec-value" in result.stdout and b"GIVEN=given-value" in result.stdout
        shell = await machine.open_shell()
        seen = await shell.run("env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'", timeout_s=30)
        assert seen.exit_code == 0 and "FROM_SPEC=spec-value" in seen.output and "USER=agent" in seen.output
        assert secret not in seen.output and SECRET_VARIABLE not in seen.output and "LD_PRELOAD" not in seen.output


async def test_exit_codes_and_deaths_by_signal_are_reported(machine):
    assert (await machine.exec(["true"])).exit_code == 0
    failed = await machine.exec(["sh", "-c", "echo out; echo err >&2; exit 7"], user="agent")
    assert (failed.exit_code, failed.ok, failed.stdout, failed.stderr) == (7, False, b"out\n", b"err\n")
    killed = await machine.exec(["sh", "-c", "kill -9 $$"], user="agent")
    assert killed.exit_code == 137 and not killed.timed_out
    missing = await machine.exec(["/nonexistent/program"])
    assert missing.exit_code not in (0, None) or missing.stderr


async def test_stdin_is_fed_whole_and_an_exec_without_stdin_reads_end_of_file(machine):
    data = secrets.token_bytes(3 * 2**20)
    counted = await machine.exec(["sh", "-c", "wc -c; head -c 4 /dev/stdin | wc -c"], stdin=data, user="agent")
    assert counted.ok and counted.stdout.split() == [str(len(data)).encode(), b"0"]
    echoed = await machine.exec(["cat"], stdin=b"line one\nline two\n")
    assert echoed.stdout == b"line one\nline two\n"
    nothing = await machine.exec(["sh", "-c", "cat; read x; echo read=$?"], user="agent", timeout_s=30)
    assert nothing.ok and nothing.stdout == b"read=1\n" and not nothing.timed_out


async def test_a_50_mb_flood_is_capped_on_both_streams_with_the_truncated_flags(machine):
    flood = ("head -c 50000000 /dev/zero | tr '\\0' a; head -c 50000000 /dev/zero | tr '\\0' b >&2; "
             "echo done-flooding >&2; exit 3")
    result = await machine.exec(["sh", "-c", flood], user="agent", max_output_bytes=65536, timeout_s=120)
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout == b"a" * 65536 and result.stdout_truncated
    assert result.stderr == b"b" * 65536 and result.stderr_truncated
    small = await machine.exec(["echo", "small"], max_output_bytes=65536)
    assert small.stdout == b"small\n" and not small.stdout_truncated and not small.stderr_truncated


async def test_an_exec_time_out_is_reported_and_leaves_nothing_running(machine):
    child, daemon, foreground = marker(), marker(), marker()
    script = (f"sleep {child} & setsid sleep {daemon} </dev/null >/dev/null 2>&1 & "
              f"( (sleep {foreground} &) ); sleep {foreground}")
    result = await agent_sh(machine, script, timeout_s=3)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert await running(machine, child, daemon, foreground) == set()
    after = await machine.exec(["echo", "still here"])
    assert after.ok and after.stdout == b"still here\n"


# --- files --------------------------------------------------------------------------------------------------


async def test_put_files_makes_folders_sets_the_owner_and_the_executable_bit(machine):
    await machine.put_files("/app/new/deep", {"run.sh": b"#!/bin/sh\necho ran as $(id -un)\n",
                                              "sub/data.txt": b"data\n"}, owner="agent")
    ran = await agent_sh(machine, "cd /app/new/deep && ./run.sh && stat -c '%n %U %a' run.sh sub/data.txt sub "
                                  "&& echo more >> sub/data.txt && cat sub/data.txt")
    assert ran.ok, ran
    assert ran.stdout.decode().splitlines() == ["ran as agent", "run.sh agent 755", "sub/data.txt agent 644",
                                                "sub agent 755", "data", "more"]
    await machine.put_files("/tests", {"test.sh": b"#!/bin/bash\necho test\n", "data.txt": b"x"})
    as_root = await machine.exec(["stat", "-c", "%n %U %a", "/tests/test.sh", "/tests/data.txt"])
    assert as_root.stdout.decode().splitlines() == ["/tests/test.sh root 755", "/tests/data.txt root 644"]
    written = await agent_sh(machine, "echo agent >> /tests/data.txt")
    # a container: root's files are root's; bwrap: the agent owns every writable folder of its machine (no second
    # uid), which is why the verifier empties /tests, /logs/verifier and /solution itself before the tests.
    assert written.ok == (machine.backend == "bwrap")
    assert await machine.read_file("/app/new/deep/sub/data.txt") == b"data\nmore\n"


@pytest.mark.parametrize("name", ["../escape", "/etc/escape", "a/../../escape", ".", "a/../.."])
async def test_put_files_refuses_names_that_leave_the_destination(machine, name):
    with pytest.raises(SandboxError, match="relative and stay inside"):
        await machine.put_files("/app/box", {name: b"x"})
    assert (await machine.exec(["sh", "-c", "ls -A /app /etc | grep -c escape"])).stdout == b"0\n"


@pytest.mark.parametrize("machine_backend", ["bwrap"], indirect=True)  # a container machine's root may write anywhere
async def test_put_files_outside_the_machines_folders_is_refused_on_bwrap(machine):
    with pytest.raises(SandboxError, match="outside the bwrap machine's writable folders"):
        await machine.put_files("/etc", {"evil": b"x"})


async def test_put_files_never_writes_through_a_symlink_the_agent_planted(machine, tmp_path):
    host_folder = tmp_path / "host-folder"
    host_folder.mkdir()
    planted = await agent_sh(machine, f"ln -s {host_folder} /app/to-host && ln -s /etc /app/to-etc && "
                                      "ln -s /etc/passwd /app/to-passwd")
    assert planted.ok, planted
    passwd = (await machine.exec(["cat", "/etc/passwd"])).stdout
    for name in ("to-host/x", "to-etc/x"):
        try:  # a container replaces the symlink with a folder of the machine; bwrap refuses the path
            await machine.put_files("/app", {name: b"planted\n"})
        except SandboxError:
            assert machine.backend == "bwrap"
    await machine.put_files("/app", {"to-passwd": b"replaced\n"})  # the link itself is replaced
    assert list(host_folder.iterdir()) == []
    after = await machine.exec(["sh", "-c", "cat /etc/passwd; ls /etc/x 2>&1; cat /app/to-passwd"])
    assert after.stdout.startswith(passwd) and b"No such file" in after.stdout
    assert after.stdout.endswith(b"replaced\n")


async def test_read_file_reads_regular_files_only_and_never_follows_a_symlink(machine, tmp_path):
    host_secret = tmp_path / "secret.txt"
    host_secret.write_text("HOST-SECRET")
    await machine.put_files("/app", {"data.bin": b"0123456789"})
    assert await machine.read_file("/app/data.bin") == b"0123456789"
    assert await machine.read_file("/app/data.bin", max_bytes=4) == b"0123"
    assert await machine.read_file("/app//./data.bin") == b"0123456789"
    planted = await agent_sh(machine, f"ln -s /etc/shadow /app/shadow; ln -s /etc /app/etc; ln -s {tmp_path} /app/host;"
                                      " ln -s data.bin /app/relative; mkfifo /app/fifo; mkdir /app/folder; "
                                      "ln -s ../../app /home/agent/app")
    assert planted.ok, planted
    refused = ["/app/missing", "/app/folder", "/app/fifo", "/app/shadow", "/app/etc/shadow", "/app/etc/passwd",
               "/app/host/secret.txt", "/app/relative", "/home/agent/app/data.bin"]
    if machine.backend == "bwrap":
        refused.append("/etc/passwd")  # outside the machine's own folders: the host's, never read
    for path in refused:
        assert await machine.read_file(path) is None, path


# --- the shell ------------------------------------------------------------------------------------------------


async def test_the_shell_keeps_its_state_between_commands(machine):
    shell = await machine.open_shell()
    first = await shell.run("cd /tmp && export KEPT=kept-value && greet() { echo \"hello $1\"; } && id -un", 30)
    assert (first.exit_code, first.output) == (0, "agent")
    second = await shell.run('pwd; echo "$KEPT"; greet there; cat <<EOF\nheredoc line\nEOF\n(exit 4)', 30)
    assert second.exit_code == 4 and second.output.splitlines() == ["/tmp", "kept-value", "hello there",
                                                                    "heredoc line"]
    reads = await shell.run("cat; read line; echo read=$?", 30)  # stdin is /dev/null, not the next command
    assert reads.output == "read=1" and not reads.timed_out
    assert shell.restarts == 0


async def test_ctrl_c_interrupts_a_command_and_the_shell_goes_on(machine):
    shell = await machine.open_shell()
    await shell.run("export KEPT=yes", 30)
    slow = marker()
    result = await shell.run(f"echo started; sleep {slow}", timeout_s=5)  # time for the echo on a loaded machine
    assert result.timed_out and result.exit_code is None and not result.shell_restarted
    assert "started" in result.output
    after = await shell.run('echo "$KEPT"', 30)
    assert after.output == "yes" and after.exit_code == 0
    assert await running(machine, slow) == set()


async def test_a_command_that_ignores_sigint_is_killed_and_the_shell_goes_on(machine):
    shell = await machine.open_shell()
    await shell.run("export KEPT=yes", 30)
    stubborn = marker()
    program = (f"python3 -c 'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               f"print(\"ignoring\", flush=True); time.sleep({stubborn})'")
    result = await shell.run(program, timeout_s=8)  # Python must be up and ignoring SIGINT when Ctrl-C comes
    assert result.timed_out and not result.shell_restarted and "ignoring" in result.output
    after = await shell.run('echo "$KEPT"', 30)
    assert after.output == "yes"
    assert await running(machine, stubborn) == set()


@pytest.fixture(params=["default", "ignored"])
def host_interrupts(request: pytest.FixtureRequest) -> str:
    """This process's SIGINT as it is, then ignored (a run started with ``&`` from a script): the shell must not care."""
    if request.param == "ignored":
        request.getfixturevalue("host_ignores_interrupts")
    return request.param


async def test_commands_and_the_shell_start_with_default_signals_whatever_this_process_ignores(
        host_ignores_interrupts, machine):
    executed = await machine.exec(["cat", "/proc/self/status"], user="agent", timeout_s=30)
    shell = await machine.open_shell()
    typed = await shell.run("cat /proc/self/status", 30)
    assert signal_masks(executed.stdout.decode()) == {"SigIgn": 0, "SigBlk": 0}
    assert signal_masks(typed.output) == {"SigIgn": 0, "SigBlk": 0}


async def test_a_shell_that_cannot_be_interrupted_is_restarted(host_interrupts, machine):
    shell = await machine.open_shell()
    await shell.run("export KEPT=yes; trap '' INT", 30)  # in place before the loop, however slow the machine
    # Time for the shell to read the command: a Ctrl-C before it has (a loaded machine) discards the unread
    # input, and the command then never ran (a time-out without a restart, rightly).
    result = await shell.run("echo looping; while :; do :; done", timeout_s=8)
    assert result.output == "looping"
    assert result.timed_out and result.shell_restarted and result.exit_code is None
    after = await shell.run('echo "kept=$KEPT"; id -un', 30)
    assert after.output.splitlines() == ["kept=", "agent"] and shell.restarts == 1


async def test_exit_and_a_killed_shell_start_a_fresh_shell(machine):
    shell = await machine.open_shell()
    await shell.run("export KEPT=yes; cd /tmp", 30)
    for command in ("exit", "exit 3", "kill -9 $$"):
        gone = await shell.run(command, 30)
        assert gone.shell_restarted and not gone.timed_out and gone.exit_code is None, command
        fresh = await shell.run('echo "kept=$KEPT"; pwd', 30)
        assert fresh.output.splitlines() == ["kept=", "/app"] and fresh.exit_code == 0
    assert shell.restarts == 3


# --- kill_processes and close ------------------------------------------------------------------------------


async def test_kill_processes_leaves_nothing_of_the_agent(machine):
    shell = await machine.open_shell()
    job, daemon, double, loop, disowned = (marker() for _ in range(5))
    started = await shell.run(
        f"sleep {job} &\n"
        f"setsid nohup sleep {daemon} >/dev/null 2>&1 &\n"
        f"( (sleep {double} </dev/null >/dev/null 2>&1 &) & )\n"
        f"nohup sh -c 'while :; do sleep {loop}; done' >/dev/null 2>&1 &\n"
        f"sleep {disowned} & disown\n"
        "echo started", 30)
    assert "started" in started.output.splitlines(), started
    markers = (job, daemon, double, loop, disowned)
    extra = ()
    if in_container(machine.backend):  # an exec's daemons outlive the exec in a container (not on bwrap)
        extra = (marker(), marker())
        await agent_sh(machine, f"setsid sleep {extra[0]} </dev/null >/dev/null 2>&1 &")
        await machine.exec(["sh", "-c", f"setsid sleep {extra[1]} </dev/null >/dev/null 2>&1 &"])
    assert await running(machine, *markers, *extra, settle_for="there") == {*markers, *extra}  # the control
    await machine.kill_processes()
    assert await running(machine, *markers, *extra) == set()
    assert (await machine.exec(["echo", "alive"])).stdout == b"alive\n"
    fresh = await machine.open_shell()
    assert (await fresh.run("id -un", 30)).output == "agent"


async def test_close_removes_the_container_or_the_host_folder_and_every_process(machine_backend):
    machine = await start_machine(machine_spec(), machine_backend)
    shell = await machine.open_shell()
    left = marker()
    await shell.run(f"setsid nohup sleep {left} >/dev/null 2>&1 &", 30)
    assert await running(machine, left, settle_for="there") == {left}
    await machine.close()
    await machine.close()  # idempotent
    assert host_processes(left) == []
    if in_container(machine_backend):
        ids = [c["Id"] for c in engine_api(machine_backend).containers(all=True)]
        assert machine.container_id not in ids
    else:
        assert not machine.host_dir.exists()
        assert machine.cgroup is None or not any(folder.exists() for folder in machine.cgroup.dirs)
        assert Path(tempfile.gettempdir()).exists()
