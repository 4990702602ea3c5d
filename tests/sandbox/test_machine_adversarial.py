"""Hostile commands in a machine's agent shell stay contained, on every machine backend (bwrap, docker, podman).

Each attack runs as a terminal agent would run it (mostly in the agent's persistent shell, some as
root execs where the verifier's root must be contained too), in a machine with small limits, and is
followed by the checks that matter: the host's files, processes and terminals are untouched, the
machine still answers its root (the verifier) or was cleanly ended, and nothing of the attack is
left running. Bombs are bounded by ``BOMB_SPEC``; every machine is closed by its fixture.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
from pathlib import Path

import pytest
import test_machine
from skyrl_sandbox.machine import Machine
from skyrl_sandbox.machine_factory import start_machine
from test_machine import CONTAINER_BACKENDS, agent_sh, engine_api, in_container, machine_spec, marker, running

machine_backend = test_machine.machine_backend  # the fixture: each machine backend in turn
REPO = Path(__file__).resolve().parents[2]
MEMORY_MB, MAX_PROCESSES, STORAGE_MB = 256, 64, 64


def bomb_spec():
    return machine_spec(memory_mb=MEMORY_MB, max_processes=MAX_PROCESSES, storage_mb=STORAGE_MB)


MACHINE_SPEC = bomb_spec  # what the `machine` fixture starts
machine = test_machine.machine


@pytest.fixture
async def shell(machine: Machine):
    return await machine.open_shell()


async def still_serves_its_verifier(machine: Machine) -> None:
    """What the verifier needs after the agent: kill the agent, run a root test that writes a reward, read it."""
    await machine.kill_processes()
    await machine.put_files("/tests", {"test.sh": b"#!/bin/bash\nmkdir -p /logs/verifier\n"
                                                  b"python3 -c 'print(1)' > /logs/verifier/reward.txt\n"})
    result = await machine.exec(["bash", "/tests/test.sh"], cwd="/", timeout_s=60)
    assert result.ok, result
    assert await machine.read_file("/logs/verifier/reward.txt") == b"1\n"
    fresh = await machine.open_shell()
    answer = await fresh.run("echo answering as $(id -un)", 30)
    assert answer.output == "answering as agent", answer


def the_host_can_start_processes() -> None:
    assert subprocess.run(["true"], timeout=60).returncode == 0


# --- reading the host ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["agent shell", "root exec"])
async def test_the_host_its_repository_root_folder_and_engine_sockets_are_out_of_reach(machine, shell, who, tmp_path):
    token = secrets.token_hex(8)  # in the files' contents, not in their names (error messages repeat those)
    private = tmp_path / "id_rsa"
    private.write_text(f"HOST-PRIVATE-{token}")
    private.chmod(0o600)
    root_canary = Path("/root") / f".skyrl-canary-{secrets.token_hex(4)}"
    root_canary.write_text(f"HOST-ROOT-{token}")
    probe = f"""
cat {private} /etc/shadow 2>&1 | head -c 2000
ls -A {REPO} 2>&1; head -c 300 {REPO}/pyproject.toml 2>&1
ls -A /root 2>&1; cat {root_canary} 2>&1
ls -ld /var/run/docker.sock /run/docker.sock /var/lib/skyrl-docker /var/lib/docker /run/skyrl-podman 2>&1
python3 - <<'EOF'
import socket
for path in ("/var/run/docker.sock", "/run/docker.sock", "/var/lib/skyrl-docker/docker.sock",
             "/run/skyrl-podman/podman.sock", "/run/podman/podman.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print("CONNECTED", path)
    except OSError as exc:
        print("no socket at", path, exc.errno)
EOF
"""
    try:
        if who == "agent shell":
            output = (await shell.run(probe, 60)).output
        else:
            result = await machine.exec(["bash", "-c", probe], timeout_s=60, max_output_bytes=1 << 20)
            output = (result.stdout + result.stderr).decode(errors="replace")
    finally:
        root_canary.unlink()
    assert token not in output and "CONNECTED" not in output and "[tool.pytest" not in output, output
    assert output.count("no socket at") == 5
    assert f"ls: cannot access '{REPO}': No such file or directory" in output
    host_users = {line.split(":")[0]: line for line in Path("/etc/shadow").read_text().splitlines() if line}
    for line in host_users.values():
        if line.split(":")[1] not in ("*", "!", "!*", "", "x"):  # a real secret of the host's
            assert line not in output


async def test_another_machine_is_invisible(machine_backend, machine, shell):
    token = secrets.token_hex(8)
    other_sleep = marker()
    async with await start_machine(bomb_spec(), machine_backend) as other:
        await other.put_files("/app", {f"secret-{token}.txt": f"OTHER-{token}".encode()})
        await other.exec(["sh", "-c", f"echo OTHER-{token} > /tmp/secret-{token}.txt"])
        other_shell = await other.open_shell()
        await other_shell.run(f"sleep {other_sleep} &", 30)
        assert await running(other, other_sleep, settle_for="there") == {other_sleep}
        where = str(getattr(other, "host_dir", "/var/lib/skyrl-docker"))
        pattern = other_sleep.replace(".", "[.]")  # grep's own command line must not match
        seen = await shell.run(f"grep -rls {token} /app /tmp /home /logs 2>/dev/null; ls -A /app /tmp; "
                               f"grep -l '{pattern}' /proc/[0-9]*/cmdline 2>/dev/null; ls {where} 2>&1", 60)
        assert token not in seen.output and "/cmdline" not in seen.output, seen.output
        assert "No such file or directory" in seen.output


# --- network ---------------------------------------------------------------------------------------------------


async def test_there_is_no_network_and_no_host_socket(machine, shell):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"skyrl-test-{secrets.token_hex(6)}"
    abstract.bind(b"\0" + name.encode())
    abstract.listen()
    abstract.setblocking(False)
    port = listener.getsockname()[1]
    program = f"""
import socket
print("interfaces", sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]))
for what, target in (("internet", ("1.1.1.1", 53)), ("host loopback", ("127.0.0.1", {port}))):
    try:
        socket.create_connection(target, 2)
        print("REACHED", what)
    except OSError as exc:
        print("unreachable", what, exc.errno)
try:
    socket.getaddrinfo("example.com", 80)
    print("RESOLVED")
except OSError:
    print("no dns")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(b"\\0{name}")
    print("REACHED abstract socket")
except OSError as exc:
    print("unreachable abstract socket", exc.errno)
"""
    try:
        result = await shell.run(f"python3 - <<'EOF'\n{program}\nEOF", 60)
        with pytest.raises(BlockingIOError):
            listener.accept()
        with pytest.raises(BlockingIOError):
            abstract.accept()
    finally:
        listener.close()
        abstract.close()
    assert "interfaces ['lo']" in result.output, result.output
    assert "REACHED" not in result.output and "RESOLVED" not in result.output
    assert result.output.count("unreachable") == 3


# --- resource bombs --------------------------------------------------------------------------------------------


async def test_a_fork_bomb_is_held_by_the_pids_limit_and_the_machine_answers_afterwards(machine, shell):
    bomb = await shell.run(":(){ :|:& };:", timeout_s=5)
    after = await shell.run("sleep 2; echo after the bomb", timeout_s=6)
    assert "Resource temporarily unavailable" in bomb.output + after.output
    if in_container(machine.backend):
        inspected = engine_api(machine.backend).inspect_container(machine.container_id)
        assert inspected["HostConfig"]["PidsLimit"] == MAX_PROCESSES and inspected["State"]["Running"]
    else:
        events = (machine.cgroup.dirs[0] / "pids.events").read_text().split()
        assert int(events[events.index("max") + 1]) > 0  # the limit refused forks
    the_host_can_start_processes()
    await still_serves_its_verifier(machine)


async def test_a_memory_bomb_is_killed_at_memory_mb(machine, shell):
    bomb = await shell.run("python3 -c 'x = [bytearray(64 << 20) for _ in range(64)]; print(\"SURVIVED\")'; "
                           "echo status=$?", timeout_s=60)
    assert "SURVIVED" not in bomb.output and "status=137" in bomb.output, bomb
    assert not bomb.timed_out
    the_host_can_start_processes()
    await still_serves_its_verifier(machine)


async def test_a_disk_fill_stops_at_the_file_size_limit(machine, shell):
    fill = await shell.run("dd if=/dev/zero of=/app/big bs=1M count=100000 2>/dev/null; echo status=$?; "
                           "stat -c size=%s /app/big", timeout_s=120)
    assert "File size limit exceeded" in fill.output and "status=153" in fill.output, fill
    size = int(fill.output.split("size=")[1].split()[0])
    assert 0 < size <= STORAGE_MB * 2**20
    cleaned = await shell.run("rm /app/big && echo removed", 30)
    assert cleaned.output == "removed"
    await still_serves_its_verifier(machine)


async def test_an_output_flood_in_the_shell_is_cut_to_a_head_and_a_tail(machine):
    shell = await machine.open_shell(max_output_bytes=16 * 1024)
    flood = await shell.run("head -c 50000000 /dev/zero | tr '\\0' a; echo; echo the-end", timeout_s=120)
    assert flood.exit_code == 0 and flood.omitted_bytes > 40_000_000 and not flood.timed_out
    assert len(flood.output) < 20 * 1024 and flood.output.endswith("the-end")
    assert (await shell.run("echo still", 30)).output == "still"


# --- destruction -----------------------------------------------------------------------------------------------


async def test_rm_rf_root_as_the_agent_spares_the_machine_and_the_host(machine_backend, machine, shell, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("still here")
    async with await start_machine(bomb_spec(), machine_backend) as neighbour:
        await neighbour.put_files("/app", {"keep.txt": b"neighbour's"})
        wiped = await shell.run("rm -rf / --no-preserve-root 2>/dev/null; echo rm-done", timeout_s=300)
        assert not wiped.timed_out, wiped
        assert await neighbour.read_file("/app/keep.txt") == b"neighbour's"
    assert canary.read_text() == "still here" and (REPO / "pyproject.toml").is_file()
    the_host_can_start_processes()
    await still_serves_its_verifier(machine)


async def test_killing_everything_it_can_kills_only_the_agents_own_processes(machine, shell):
    root_sleep, agent_sleep = marker(), marker()
    root_exec = None
    if in_container(machine.backend):
        await machine.exec(["sh", "-c", f"setsid sleep {root_sleep} </dev/null >/dev/null 2>&1 &"])
    else:  # a bwrap exec's processes end with it: hold one open
        root_exec = asyncio.ensure_future(machine.exec(["sleep", root_sleep], timeout_s=300))
    assert await running(machine, root_sleep, settle_for="there") == {root_sleep}
    await shell.run(f"sleep {agent_sleep} &", 30)
    assert await running(machine, agent_sleep, settle_for="there") == {agent_sleep}

    killer = await agent_sh(machine, "kill -9 1; kill -9 -1; echo the-killer-lives")
    assert killer.stdout == b"the-killer-lives\n"
    assert await running(machine, root_sleep, settle_for="there") == {root_sleep}  # root's process lived on
    if in_container(machine.backend):  # same user, same PID namespace: the agent's own job is gone
        assert await running(machine, agent_sleep) == set()
    in_shell = await shell.run("kill -9 1; kill -9 $PPID; kill -9 -1; echo the-shell-lives", 30)
    assert in_shell.exit_code == 0 or in_shell.shell_restarted
    assert await running(machine, agent_sleep) == set()
    again = (await shell.run("echo again", 30)).output.splitlines()
    # bash may report the killed job ("[1]+  Killed  sleep ...") around the echo, as a terminal would
    assert "again" in again and all(line == "again" or "Killed" in line for line in again), again
    if machine.backend == "bwrap":
        assert await running(machine, root_sleep, settle_for="there") == {root_sleep}
    # (a container: a shell that died is replaced after a sweep of every process of the container but its own)
    if in_container(machine.backend):
        assert engine_api(machine.backend).inspect_container(machine.container_id)["State"]["Running"]
    await still_serves_its_verifier(machine)
    if root_exec is not None:
        assert (await root_exec).exit_code != 0  # killed by kill_processes, not by the agent
    assert await running(machine, root_sleep) == set()


async def test_a_process_that_looks_dead_in_proc_dies_with_the_rest(machine, shell):
    """A thread-group leader that exited (SYS_exit) while its thread runs shows as a zombie with no command line
    in /proc; the kill goes by the machine's cgroup, which still lists it, so its thread stops writing too."""
    script = ("import ctypes, os, threading, time\n"
              "def tick():\n"
              "    while True:\n"
              "        with open('/tmp/ticks', 'a') as f: f.write('.')\n"
              "        time.sleep(0.01)\n"
              "threading.Thread(target=tick).start()\n"
              "ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[os.uname().machine], 0)\n")
    await machine.put_files("/tmp/ghost", {"ghost.py": script.encode()})
    started = await shell.run("setsid python3 /tmp/ghost/ghost.py </dev/null >/dev/null 2>&1 & sleep 0.5; "
                              "for p in /proc/[0-9]*; do [ \"$(ls $p/task 2>/dev/null | wc -l)\" -gt 1 ] && "
                              "cut -d' ' -f3 $p/stat; done", 30)
    assert "Z" in started.output.split(), started.output  # the leader is a zombie, its thread runs
    await machine.kill_processes()
    before = await machine.read_file("/tmp/ticks")
    await asyncio.sleep(0.5)
    assert before and await machine.read_file("/tmp/ticks") == before, "the ghost's thread outlived the kill"


@pytest.mark.parametrize("backend", CONTAINER_BACKENDS)
async def test_an_engine_whose_cgroups_are_out_of_sight_kills_by_restarting_the_container(backend):
    """An engine on another host: its containers' cgroups are not in this machine's /proc and /sys. The kill then
    restarts the container (its PID namespace ends with its init); the machine, its user and files go on."""
    from skyrl_sandbox.testing import require_backend

    require_backend(backend)
    async with await start_machine(bomb_spec(), backend) as machine:
        machine._group = None  # as on a machine that cannot see the engine's cgroups
        shell = await machine.open_shell()
        job = marker()
        await shell.run(f"echo kept > /app/kept; setsid sleep {job} </dev/null >/dev/null 2>&1 &", 30)
        assert await running(machine, job, settle_for="there") == {job}
        await machine.kill_processes()
        assert await running(machine, job) == set()
        after = await agent_sh(machine, "cat /app/kept; id -un")
        assert after.stdout == b"kept\nagent\n", after


async def test_folders_the_agent_made_undeletable_are_removed_with_the_machine(bwrap_machine_dir):
    machine, host_dir = bwrap_machine_dir
    planted = await agent_sh(machine, """mkdir -p /app/t/a/b ~/t && touch /app/t/a/b/f ~/t/f
python3 -c "import os; os.chdir('/app')
for _ in range(3000): os.mkdir('d'); os.chdir('d')
os.chmod('.', 0o500)"
chmod 000 /app/t/a/b; chmod 500 /app/t/a /app/t ~/t; echo planted""")
    assert planted.stdout == b"planted\n", planted
    await machine.close()
    assert not host_dir.exists()


@pytest.fixture
async def bwrap_machine_dir():
    from skyrl_sandbox.testing import require_backend

    require_backend("bwrap")
    machine = await start_machine(bomb_spec(), "bwrap")
    try:
        yield machine, machine.host_dir
    finally:
        await machine.close()


# --- terminals, privileges, the kernel ----------------------------------------------------------------------------


async def test_terminals_of_others_cannot_be_written_or_typed_into(machine, shell):
    primary, secondary = os.openpty()  # a terminal of this host, as another user's would be
    host_tty = os.ttyname(secondary)
    os.set_blocking(primary, False)
    program = f"""
import fcntl, glob, os, termios
own = os.fstat(1).st_rdev
for path in sorted(set(glob.glob("/dev/pts/*") + glob.glob("/dev/tty*") + ["/dev/console", "{host_tty}"])):
    try:
        if path == "/dev/tty" or os.stat(path).st_rdev == own:
            continue  # the agent's own terminal: typing into it types into its own shell
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        continue
    for attempt in ("write", "TIOCSTI"):
        try:
            if attempt == "write":
                os.write(fd, b"PWNED-WRITE\\n")
            else:
                for byte in b"echo PWNED-TYPED\\n":
                    fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
            print("did", attempt, "on", path)
        except OSError as exc:
            print("no", attempt, "on", path, exc.errno)
print("tried")
"""
    try:
        result = await shell.run(f"python3 - <<'EOF'\n{program}\nEOF", 60)
        assert result.output.endswith("tried"), result
        try:
            received = os.read(primary, 65536)
        except BlockingIOError:
            received = b""
        assert b"PWNED" not in received
    finally:
        os.close(primary)
        os.close(secondary)
    no_tty = await agent_sh(machine, "python3 -c \"import fcntl, termios; "
                                     "fcntl.ioctl(open('/dev/tty', 'wb'), termios.TIOCSTI, b'x')\"")
    assert no_tty.exit_code != 0  # an exec has no terminal to type into
    assert (await shell.run("echo unharmed", 30)).output == "unharmed"


async def test_setuid_programs_and_su_give_the_agent_no_privilege(machine, shell):
    made = await machine.exec(["sh", "-c", "cp /usr/bin/python3 /app/suid-python && chown root:root /app/suid-python"
                                           " && chmod 4755 /app/suid-python && stat -c %a /app/suid-python"])
    assert made.stdout == b"4755\n", made
    probe = await shell.run(
        "grep NoNewPrivs /proc/self/status\n"
        "/app/suid-python -c 'import os; print(\"euid\", os.geteuid())'\n"
        "python3 -c 'import os; os.setuid(0)' 2>/dev/null || echo setuid refused\n"
        "su -c 'echo ROOT-SHELL' root </dev/null 2>&1; echo su=$?\n"
        "sudo -n true 2>&1; echo sudo=$?\n"
        "id -u", 60)
    lines = probe.output.splitlines()
    assert "NoNewPrivs:\t1" in lines and "euid 1000" in lines and "ROOT-SHELL" not in probe.output, probe
    assert "setuid refused" in lines
    assert "su=0" not in lines and "sudo=0" not in lines and lines[-1] == "1000"


# Writes of the value a setting already has: refused is what must happen, and were one to go through,
# nothing on the host would change.
SAME_VALUE = "cat /proc/sys/{0} > /tmp/.value && cat /tmp/.value > /proc/sys/{0}"


@pytest.mark.parametrize("who", ["agent", "root"])
async def test_kernel_settings_mounts_and_new_namespaces_are_refused(machine, who):
    attempts = {
        "core_pattern": SAME_VALUE.format("kernel/core_pattern"),  # a program the host's kernel runs as root
        "randomize_va_space": SAME_VALUE.format("kernel/randomize_va_space"),
        "overcommit": SAME_VALUE.format("vm/overcommit_memory"),
        "sysrq": "test -e /proc/sysrq-trigger || exit 9; echo h > /proc/sysrq-trigger",  # h: print the help
        "mount": "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
        "userns": "unshare -U true",
        "netns": "unshare -n true",
    }
    script = "; ".join(f"( {command} ) 2>/dev/null; echo {name}=$?" for name, command in attempts.items())
    result = await machine.exec(["sh", "-c", script], user=who, cwd="/")
    statuses = dict(line.split("=") for line in result.stdout.decode().split())
    assert set(statuses) == set(attempts) and all(code != "0" for code in statuses.values()), statuses


async def test_a_fresh_machine_holds_no_tests_or_solution_for_the_agent_to_read(machine, shell):
    looked = await shell.run("ls -A /tests /solution 2>/dev/null | grep -v ':$' | grep -c . ; "
                             "find /app /home /tmp /logs /tests /solution \\( -name test.sh -o -name solve.sh \\) 2>/dev/null | grep -c .", 120)
    assert looked.output.split() == ["0", "0"], looked
