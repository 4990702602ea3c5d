"""Hostile model code: every attempt must be contained with a clear error and leave the host unharmed.

Each test is one attack (or a small family of one attack). Most run on both backends; the ones
that only the OS-level isolation of bubblewrap can contain are marked ``bwrap`` only.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from hostile import (
    BWRAP_SKIP,
    FIND_CHANNEL,
    FIND_TOKEN,
    FRAME,
    IS_PIPE,
    KERNEL_BACKENDS,
    TAMPER_POLICY,
    WRITE_ALL,
    hostile_config,
    still_healthy,
)
from skyrl_rlm_repl.sandbox import Sandbox, SandboxError
from skyrl_rlm_repl.sandbox import sandbox as sandbox_module
from skyrl_sandbox import get_backend
from skyrl_sandbox.cgroups import cgroup_support

REPO = Path(__file__).resolve().parents[2]
FAKE_KEY = "sk-fake-4f9d2c7e1b-do-not-leak"
CONTAINED = re.compile(r"PermissionError: .* outside the sandbox|FileNotFoundError")


@pytest.fixture
def host_secret(tmp_path) -> Path:
    secret = tmp_path / "id_rsa"
    secret.write_text("HOST-PRIVATE-KEY-MATERIAL")
    return secret


def in_sandbox_tmp(box: Sandbox, path: str | Path) -> bool:
    """With a strong backend (bwrap, a container), /tmp inside the sandbox is a private tmpfs, so host paths there
    simply do not exist."""
    return get_backend(box.backend).strong and str(path).startswith("/tmp/")


# --- files outside the sandbox --------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/passwd", str(REPO / "pyproject.toml"),
                                  os.path.expanduser("~/.ssh/id_rsa"), "/proc/1/environ"])
async def test_reading_host_files_is_refused(sandbox, path):
    result = await sandbox.execute(f"print(open({path!r}).read()[:200])")
    assert result.stdout == ""
    # bwrap: a checkout under /tmp lies where the sandbox's own empty tmpfs is mounted, so it is not found
    assert CONTAINED.search(result.error) if in_sandbox_tmp(sandbox, path) else (
        "PermissionError" in result.error and "outside the sandbox" in result.error)
    assert await still_healthy(sandbox)


async def test_reading_a_host_secret_through_a_symlink_is_refused(sandbox, host_secret):
    result = await sandbox.execute(f"import os\nos.symlink({str(host_secret)!r}, 'link')\nprint(open('link').read())")
    assert "HOST-PRIVATE" not in result.stdout
    # subprocess: the policy resolves the link and refuses; bwrap: the host path does not exist in the sandbox
    assert CONTAINED.search(result.error)


@pytest.mark.parametrize("target", ["tmp", "repo"])
async def test_writing_host_files_is_refused(sandbox, tmp_path, target):
    victim = (tmp_path if target == "tmp" else REPO / "tests" / "rlm_repl") / "pwned_by_sandbox.txt"
    result = await sandbox.execute(f"import os\nos.makedirs({str(victim.parent)!r}, exist_ok=True)\n"
                                   f"open({str(victim)!r}, 'w').write('pwned')")
    if not in_sandbox_tmp(sandbox, victim):
        assert "PermissionError" in result.error and "outside the sandbox" in result.error
    assert not victim.exists()  # with bwrap, /tmp/... is the sandbox's own tmpfs: the write stays in there


async def test_deleting_and_renaming_host_files_is_refused(sandbox, host_secret):
    result = await sandbox.execute(f"import os\nos.remove({str(host_secret)!r})")
    moved = await sandbox.execute(f"import os\nos.rename({str(host_secret)!r}, 'stolen')")
    assert CONTAINED.search(result.error) and CONTAINED.search(moved.error)
    assert host_secret.read_text() == "HOST-PRIVATE-KEY-MATERIAL"


async def test_listing_host_directories_is_refused(sandbox):
    result = await sandbox.execute(f"import os\nprint(os.listdir({str(REPO)!r}))")
    walked = await sandbox.execute("import glob\nprint(glob.glob('/work/**', recursive=True)[:5])")
    assert CONTAINED.search(result.error) and "pyproject" not in result.stdout
    assert "PermissionError" in walked.error


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
async def test_host_files_stay_invisible_even_after_disabling_the_audit_policy(backend):
    """The policy is only the first line: with it tampered off, the mount namespace still hides the host."""
    async with await Sandbox.create(hostile_config(backend)) as box:
        result = await box.execute(
            "import gc, os\n"
            "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
            "policy._check_path = lambda *args, **kwargs: None\n"
            "print(sorted(os.listdir('/')), os.listdir('/home') if os.path.isdir('/home') else [])\n"
            f"open({str(REPO / 'pyproject.toml')!r}).read()")
        write = await box.execute(f"open({str(REPO / 'pwned_by_sandbox.txt')!r}, 'w').write('x')")
    assert "FileNotFoundError" in result.error
    assert "work" not in result.stdout and "skyrl" in result.stdout and result.stdout.endswith(" []\n")
    if backend == "bwrap":  # docker: the image's own (empty) /home, as checked above
        assert "home" not in result.stdout
    assert "FileNotFoundError" in write.error
    assert not (REPO / "pwned_by_sandbox.txt").exists()


# --- environment variables and secrets --------------------------------------------------------------

async def test_parent_environment_and_api_keys_are_not_visible(backend, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    async with await Sandbox.create(hostile_config(backend, pool_size=0)) as box:  # started after the key was set
        env = await box.execute("import os\nprint(dict(os.environ))")
        proc = await box.execute("print(open('/proc/self/environ').read())")
        parent = await box.execute("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert FAKE_KEY not in env.stdout and "OPENAI" not in env.stdout
    assert FAKE_KEY not in proc.stdout + (proc.error or "")
    assert FAKE_KEY not in parent.stdout and "PermissionError" in parent.error


async def test_memory_scan_and_introspection_find_no_host_secrets(backend, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    async with await Sandbox.create(hostile_config(backend, pool_size=0)) as box:
        result = await box.execute(
            "import gc, sys\n"
            "def scan(hex_needle):\n"  # the needle is never a literal of the code, so it is found only if leaked
            "    needle = bytes.fromhex(hex_needle).decode()\n"
            "    return sum(1 for o in gc.get_objects() if isinstance(o, (dict, list)) and needle in repr(o))\n"
            f"hits = scan({FAKE_KEY.encode().hex()!r})\n"
            "frames, f = [], sys._getframe()\n"
            "while f is not None:\n"
            "    frames.append(f.f_code.co_filename)\n"
            "    f = f.f_back\n"
            "mods = sorted(sys.modules)\n"
            "print(hits, 'torch' in mods, 'skyrl_core' in mods, 'pydantic' in mods, frames[-1])")
    assert result.error is None
    hits, torch, core, pydantic, outermost = result.stdout.split()
    assert (hits, torch, core, pydantic) == ("0", "False", "False", "False")
    assert outermost == "<string>"  # the worker bootstrap: the host's process is not above it


# --- network ----------------------------------------------------------------------------------------

@pytest.fixture
async def loopback_server():
    connections = []

    async def on_connect(reader, writer):
        connections.append(writer.get_extra_info("peername"))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], connections
    server.close()
    await server.wait_closed()


async def test_connecting_to_a_host_loopback_server_fails(sandbox, loopback_server):
    port, connections = loopback_server
    raw = await sandbox.execute(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)")
    http = await sandbox.execute(f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1)")
    await asyncio.sleep(0.2)
    assert "network access is disabled" in raw.error
    assert "network access is disabled" in http.error
    assert connections == []


async def test_dns_lookups_fail(sandbox):
    result = await sandbox.execute("import socket\nprint(socket.getaddrinfo('example.com', 80))")
    assert result.stdout == "" and "network access is disabled" in result.error


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
async def test_network_namespace_holds_even_with_the_audit_policy_rewritten(backend, loopback_server):
    """Model code can rewrite the policy's code in its own process; the empty network namespace remains."""
    port, connections = loopback_server
    async with await Sandbox.create(hostile_config(backend)) as box:
        result = await box.execute(
            "import gc\n"
            "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
            "type(policy).check.__code__ = (lambda self, event, args: None).__code__\n"
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    # the namespace's own loopback has nothing listening: the host's server is out of reach
    assert re.search(r"ConnectionRefusedError|OSError: \[Errno 101\]", result.error)
    assert "disabled in the sandbox" not in result.error  # really the kernel, not the policy
    assert connections == []


# --- processes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [
    "import subprocess\nsubprocess.run(['ls', '/'])",
    "import os\nos.system('touch /tmp/pwned_by_sandbox')",
    "import os\nos.execv('/bin/sh', ['sh', '-c', 'id'])",
    "import os\nos.fork()",
    "import os\nos.posix_spawn('/bin/sh', ['sh'], {})",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import pty\npty.spawn('/bin/sh')",
])
async def test_starting_processes_is_refused(sandbox, code):
    result = await sandbox.execute(code)
    assert "PermissionError" in result.error and "starting processes is disabled" in result.error
    assert not result.sandbox_restarted
    assert not Path("/tmp/pwned_by_sandbox").exists()
    assert await still_healthy(sandbox)


FORK_BOMB = ("import os\n"
             "while True:\n"
             "    try:\n"
             "        os.fork()\n"
             "    except OSError as exc:\n"
             "        print('fork refused:', exc.strerror)\n"
             "        break\n")


async def test_fork_bomb_fails_in_the_kernel_even_with_the_policy_tampered(backend):
    async with await Sandbox.create(hostile_config(backend), context="public context") as box:
        bomb = await box.execute(TAMPER_POLICY + FORK_BOMB)
        spawn = await box.execute(TAMPER_POLICY + "import subprocess\nsubprocess.run(['/bin/true'])")
        threads = await box.execute("import threading\nt = threading.Thread(target=print, args=('threads work',))\n"
                                    "t.start(); t.join()")
        assert await still_healthy(box)
    assert bomb.error is None and bomb.stdout == "fork refused: Operation not permitted\n"
    assert "PermissionError: [Errno 1] Operation not permitted" in spawn.error
    assert threads.stdout == "threads work\n"


@BWRAP_SKIP
async def test_fork_bomb_with_subprocesses_allowed_is_capped_by_the_process_limit():
    if os.geteuid() == 0 and cgroup_support() is None:
        pytest.skip("root is exempt from RLIMIT_NPROC and no cgroup is writable, so allow_subprocesses is refused "
                    "(tested below)")
    config = hostile_config("bwrap", allow_subprocesses=True, max_processes=16, exec_timeout_s=3)
    async with await Sandbox.create(config, context="public context") as box:
        pid = box.pid
        bomb = await box.execute(FORK_BOMB)
        assert await still_healthy(box)
    # every forked copy answers on the shared channel: a protocol violation, or a time-out
    assert bomb.error is not None and bomb.sandbox_restarted
    assert await group_gone(pid)


async def group_gone(pgid: int, within_s: float = 10.0) -> bool:
    """True once no process of the worker's process group is left on the host."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_allowing_subprocesses_on_a_backend_that_does_not_hold_children_is_refused(backend):
    if get_backend(backend).holds_children:
        pytest.skip(f"{backend} holds child processes: it allows them")
    with pytest.raises(SandboxError, match="allow_subprocesses needs a backend that holds child processes"):
        await Sandbox.create(hostile_config(backend, allow_subprocesses=True))


@BWRAP_SKIP
async def test_allowing_subprocesses_as_root_without_a_cgroup_is_refused(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only root is exempt from RLIMIT_NPROC")
    monkeypatch.setattr(sandbox_module, "cgroup_support", lambda: None)
    with pytest.raises(SandboxError, match="refused when running as root without a writable cgroup"):
        await Sandbox.create(hostile_config("bwrap", allow_subprocesses=True))


# --- signals and the parent -------------------------------------------------------------------------

@pytest.mark.parametrize("code", [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGTERM)",
    f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
])
async def test_signalling_other_processes_is_refused(sandbox, code):
    result = await sandbox.execute(code)
    assert "PermissionError" in result.error
    assert await still_healthy(sandbox)  # and this test process is evidently still alive


async def test_signalling_the_parent_fails_in_the_kernel_even_with_the_policy_rewritten(backend):
    async with await Sandbox.create(hostile_config(backend), context="public context") as box:
        result = await box.execute(
            "import gc, os, signal\n"
            "policy = next(o for o in gc.get_objects() if type(o).__name__ == 'SandboxPolicy')\n"
            "type(policy).check.__code__ = (lambda self, event, args: None).__code__\n"
            "for target in (os.getppid(), -1):\n"
            "    try:\n"
            "        os.kill(target, signal.SIGKILL)\n"
            "    except OSError as exc:\n"
            "        print(target == -1, exc.strerror)\n")
        assert await still_healthy(box)
    assert result.error is None
    assert result.stdout == "False Operation not permitted\nTrue Operation not permitted\n"


async def test_killing_itself_is_reported_and_the_sandbox_restarts(sandbox):
    result = await sandbox.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    exited = await sandbox.execute("import os\nos._exit(3)")
    assert result.sandbox_restarted and "terminated by SIGKILL" in result.error
    assert exited.sandbox_restarted and "exited with status 3" in exited.error
    assert await still_healthy(sandbox)


# --- CPU, timeouts that code tries to escape -----------------------------------------------------------

@pytest.mark.parametrize("code", [
    "while True:\n    pass",
    "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass",
    "import signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
    "import time\nwhile True:\n    time.sleep(0.1)",
])
async def test_code_cannot_outlive_the_wall_clock_limit(sandbox, code):
    result = await sandbox.execute(code)
    assert result.timed_out and result.sandbox_restarted
    assert "time limit" in result.error
    assert await still_healthy(sandbox)


async def test_cpu_time_limit_holds_even_when_sigxcpu_is_ignored(backend):
    config = hostile_config(backend, cpu_time_s=1, exec_timeout_s=30)
    async with await Sandbox.create(config, context="public context") as box:
        result = await box.execute(
            "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
        assert await still_healthy(box)
    assert not result.timed_out and result.sandbox_restarted
    assert "was terminated by SIGKILL" in result.error


async def test_raising_resource_limits_is_refused(sandbox):
    result = await sandbox.execute(
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))")
    assert "changing resource limits is disabled" in result.error


# --- memory ----------------------------------------------------------------------------------------------

async def test_one_huge_allocation_raises_memory_error_and_state_survives(sandbox):
    await sandbox.execute("kept = 'still here'")
    result = await sandbox.execute("blob = bytearray(8 * 1024 ** 3)")
    after = await sandbox.execute("print(kept)")
    assert "MemoryError" in result.error and not result.sandbox_restarted
    assert after.stdout == "still here\n"


async def test_growing_memory_until_exhaustion_is_contained(sandbox):
    result = await sandbox.execute("chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 ** 2))")
    assert "MemoryError" in result.error or result.sandbox_restarted
    await sandbox.execute("chunks = None")
    assert await still_healthy(sandbox)


async def test_recursion_bombs_are_contained(sandbox):
    plain = await sandbox.execute("def f():\n    return f()\nf()")
    deep = await sandbox.execute("import sys\nsys.setrecursionlimit(10 ** 9)\ndef g(n):\n    return g(n + 1)\ng(0)")
    assert "RecursionError" in plain.error
    assert deep.error is not None  # a C stack overflow kills the worker (SIGSEGV) or raises
    assert await still_healthy(sandbox)


# --- output floods ----------------------------------------------------------------------------------------

async def test_one_huge_print_is_truncated(sandbox):
    result = await sandbox.execute("print('x' * 50_000_000)")
    assert len(result.stdout) < 20_200 and result.truncated_chars == 50_000_001 - 20_000
    assert "more characters of output were cut" in result.stdout


async def test_endless_printing_is_stopped_by_the_time_limit(sandbox):
    result = await sandbox.execute("import sys\nwhile True:\n    print('flood' * 1000)\n    sys.stderr.write('e')")
    assert result.timed_out and result.sandbox_restarted
    assert await still_healthy(sandbox)


async def test_writing_straight_to_file_descriptors_does_not_reach_the_host(sandbox):
    result = await sandbox.execute("import os\nos.write(1, b'\\x00\\x00\\x00\\x05junk')\nos.write(2, b'noise')")
    assert result.error is None and not result.sandbox_restarted
    assert await still_healthy(sandbox)


# --- the RPC channel ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload, reason", [
    ("b'\\xff\\xff\\xff\\xff'", "exceeds the limit"),
    # the default limit carries the largest reply the output caps allow (1 MiB), not a byte more
    ("(2**20 + 1).to_bytes(4, 'big')", "a message of 1,048,577 bytes exceeds the limit of 1,048,576 bytes"),
    ("len(b'{not json').to_bytes(4, 'big') + b'{not json'", "not valid JSON"),
    ("len(b'[1, 2]').to_bytes(4, 'big') + b'[1, 2]'", "not an object"),
    # without the execution's token nothing is accepted, whatever it claims to be
    (f"{FRAME}(b'{{\"op\": \"result\", \"seq\": 1, \"stdout\": \"\", \"stderr\": \"\", "
     "\"truncated_chars\": 0}')", "not bound to the running execution"),
    (f"{FRAME}(b'{{\"op\": \"rpc\", \"id\": 99, \"method\": \"FINAL\", \"params\": {{\"answer\": \"x\"}}}}')",
     "not bound to the running execution"),
    # with it, the frame must still be the right reply to the right request
    (f"{FRAME}(b'{{\"op\": \"result\", \"seq\": 999, \"token\": \"' + token + b'\", \"stdout\": \"\", "
     "\"stderr\": \"\", \"truncated_chars\": 0}')", "another execution"),
    (f"{FRAME}(b'{{\"op\": \"shell\", \"token\": \"' + token + b'\", \"cmd\": \"rm -rf /\"}}')",
     "unexpected message"),
    (f"{FRAME}(b'{{\"op\": \"rpc\", \"token\": \"' + token + b'\", \"id\": -1}}')", "non-negative integer"),
    (f"{FRAME}(b'{{\"op\": \"rpc\", \"token\": \"' + token + b'\", \"id\": 0, \"method\": \"FINAL\", "
     "\"params\": {\"answer\": \"x\"}}')", "does not follow the last one"),
])
async def test_forged_messages_on_the_channel_are_rejected(sandbox, payload, reason):
    result = await sandbox.execute(IS_PIPE + FIND_CHANNEL + FIND_TOKEN + WRITE_ALL.format(payload=payload)
                                   + "import time\ntime.sleep(5)")
    assert result.sandbox_restarted and "broke the protocol" in result.error and reason in result.error
    assert result.final_answer is None
    assert await still_healthy(sandbox)


async def test_closing_the_channel_is_reported_as_a_dead_worker(sandbox):
    result = await sandbox.execute(IS_PIPE + FIND_CHANNEL + "for fd in pipes:\n    os.close(fd)\n")
    assert result.sandbox_restarted and "worker" in result.error
    assert await still_healthy(sandbox)


async def test_a_huge_subcall_request_is_refused_inside_the_sandbox(backend):
    calls = []

    async def handler(method, params):
        calls.append(method)
        return "ok"

    async with await Sandbox.create(hostile_config(backend, max_message_mb=1), handler=handler) as box:
        result = await box.execute("llm_query('x' * 5_000_000)")
    assert "exceeds the sandbox limit" in result.error and calls == []


# --- scaffold names ------------------------------------------------------------------------------------------

async def test_overwriting_scaffold_names_has_no_lasting_effect(backend):
    async with await Sandbox.create(hostile_config(backend), context="public context", handler=_ok_handler,
                                    scaffold_code="def read_section(n):\n    return f'section {n}'") as box:
        await box.execute("FINAL = print\nFINAL_VAR = None\nllm_query = lambda p: 'forged'\ncontext = 'evil'\n"
                          "read_section = None\ndel SHOW_VARS\nimport builtins\n__builtins__ = {}")
        result = await box.execute("FINAL(read_section(2) + ' ' + llm_query('q') + ' ' + context)")
    assert result.error is None
    assert result.final_answer == "section 2 real answer public context"


async def _ok_handler(method, params):
    return "real answer"


async def test_forging_a_final_answer_from_a_thread_after_the_block_has_no_effect(sandbox):
    first = await sandbox.execute(
        "import threading, time\n"
        "def late():\n    time.sleep(0.3)\n    FINAL('forged')\n"
        "threading.Thread(target=late, daemon=True).start()")
    await asyncio.sleep(0.5)
    second = await sandbox.execute("x = 1")
    assert first.final_answer is None and second.final_answer is None


# --- low-level escapes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [
    "import ctypes\nctypes.CDLL(None).system(b'id')",
    "import _ctypes",
    "__import__('ctypes')",
])
async def test_ctypes_is_refused(sandbox, code):
    result = await sandbox.execute(code)
    assert "PermissionError" in result.error and "disabled in the sandbox" in result.error
    assert await still_healthy(sandbox)


async def test_walking_subclasses_to_reach_os_system_is_refused(sandbox):
    result = await sandbox.execute(
        "hits = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close']\n"
        "system = hits[0].__init__.__globals__['system']\n"
        "system('touch /tmp/pwned_by_sandbox')")
    assert "starting processes is disabled" in result.error
    assert not Path("/tmp/pwned_by_sandbox").exists()


async def test_frames_lead_only_to_the_worker(sandbox):
    result = await sandbox.execute(
        "import sys\nf = sys._getframe()\nseen = []\n"
        "while f is not None:\n    seen.append(sorted(k for k in f.f_globals if not k.startswith('__'))[:3])\n"
        "    f = f.f_back\n"
        "print(len(seen) < 12, any('torch' in s or 'skyrl_core' in s for s in seen))")
    assert result.stdout == "True False\n"


@pytest.mark.parametrize("code, error", [
    ("import skyrl_core", "ModuleNotFoundError"),
    ("import torch", "ModuleNotFoundError"),
    (f"import sys\nsys.path.insert(0, {str(REPO / 'core' / 'src')!r})\nimport skyrl_core", "Error"),
    ("import sys, os\nsys.path.insert(0, os.path.join(os.path.dirname(os.__file__), 'site-packages'))\n"
     "import pip", "Error"),
])
async def test_host_packages_cannot_be_imported(sandbox, code, error):
    result = await sandbox.execute(code)
    assert error in result.error and "skyrl_core" not in result.stdout
    assert await still_healthy(sandbox)


# --- files inside the sandbox: size and count -------------------------------------------------------------------

async def test_writing_a_huge_file_hits_the_file_size_limit(backend):
    async with await Sandbox.create(hostile_config(backend, max_file_size_mb=1)) as box:
        result = await box.execute("with open('big.bin', 'wb') as f:\n    f.write(b'0' * (8 * 1024 ** 2))")
    assert "File too large" in result.error


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
async def test_filling_the_private_tmp_hits_its_size_limit(backend):
    async with await Sandbox.create(hostile_config(backend, tmp_size_mb=4, max_file_size_mb=16)) as box:
        result = await box.execute(
            "for i in range(10):\n    with open(f'/tmp/f{i}', 'wb') as f:\n        f.write(b'0' * 1024 ** 2)")
    assert "No space left on device" in result.error


async def test_opening_thousands_of_files_hits_the_descriptor_limit(sandbox):
    result = await sandbox.execute("handles = [open(f'f{i}', 'w') for i in range(5000)]")
    await sandbox.execute("handles = None\nimport gc; gc.collect()")
    assert "Too many open files" in result.error
    assert await still_healthy(sandbox)


async def test_sqlite_cannot_touch_host_files_or_load_extensions(sandbox, tmp_path):
    victim = tmp_path / "host.db"
    result = await sandbox.execute(f"import sqlite3\nsqlite3.connect({str(victim)!r}).execute('create table t(x)')")
    extension = await sandbox.execute("import sqlite3\nsqlite3.connect(':memory:').enable_load_extension(True)")
    in_memory = await sandbox.execute("import sqlite3\nprint(sqlite3.connect(':memory:').execute('select 6*7').fetchone())")
    assert CONTAINED.search(result.error) or "unable to open database" in result.error
    assert not victim.exists()
    # refused by the policy, or not compiled into this Python at all
    assert re.search(r"loading native extensions is disabled|no attribute 'enable_load_extension'", extension.error)
    assert in_memory.stdout == "(42,)\n"


async def test_one_sandbox_cannot_read_another_sandboxs_context(backend):
    async with await Sandbox.create(hostile_config(backend), context="victim's private context") as victim:
        inbox = victim._worker.host_dir / "inbox"  # the worst case: the attacker knows the host path
        async with await Sandbox.create(hostile_config(backend)) as attacker:
            result = await attacker.execute(f"import os\nfor name in os.listdir({str(inbox)!r}):\n"
                                            f"    print(open(os.path.join({str(inbox)!r}, name)).read())")
    assert "victim" not in result.stdout
    assert CONTAINED.search(result.error)
