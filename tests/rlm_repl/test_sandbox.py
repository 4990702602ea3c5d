"""Functional behaviour of the REPL sandbox: persistence, scaffold, sub-calls, limits, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from skyrl_rlm_repl.config import RLMReplConfig
from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig, SandboxError
from skyrl_sandbox.dirs import sweep_stale_dirs
from skyrl_sandbox.testing import skip_unless_usable

BACKENDS = [
    pytest.param("bwrap", marks=skip_unless_usable("bwrap")),
    "subprocess",
]


def fast_config(**overrides) -> SandboxConfig:
    return SandboxConfig(**{"exec_timeout_s": 2.0, "cpu_time_s": 20, "memory_mb": 512, **overrides})


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


async def run_all(sandbox: Sandbox, *blocks: str):
    return [await sandbox.execute(block) for block in blocks]


def session_processes(session_id: int) -> list[int]:
    """Host PIDs whose session is ``session_id`` (workers start a new session)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id and fields[0] != "Z":
                pids.append(int(entry))
    return pids


async def wait_until_gone(session_id: int, within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (alive := session_processes(session_id)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return alive


# --- namespace and scaffold ----------------------------------------------------------------------

async def test_state_persists_across_executes(backend):
    async with await Sandbox.create(fast_config(backend=backend)) as sandbox:
        assert sandbox.backend == backend
        results = await run_all(
            sandbox,
            "x = 41\nimport re\ndef double(v):\n    return 2 * v\nclass Box:\n    size = 3",
            "print(x + 1, double(x), Box.size, re.sub('a', 'b', 'aa'))",
            "del x",
            "print('x' in globals())",
        )
    assert [r.error for r in results] == [None] * 4
    assert results[1].stdout == "42 82 3 bb\n"
    assert results[3].stdout == "False\n"


async def test_ordinary_stdlib_imports_work():
    code = "import re, json, math, collections, itertools, functools, statistics, datetime, string, textwrap\n" \
           "print(json.dumps(collections.Counter('aab').most_common(1)), math.sqrt(16))"
    async with await Sandbox.create(fast_config()) as sandbox:
        result = await sandbox.execute(code)
    assert result.error is None
    assert result.stdout == '[["a", 2]] 4.0\n'


async def test_final_and_final_var():
    async with await Sandbox.create(fast_config()) as sandbox:
        plain = await sandbox.execute("x = 1")
        final = await sandbox.execute("FINAL('Paris')")
        by_name = await sandbox.execute("ans = ['a', 'b']\nFINAL_VAR('ans')")
        by_value = await sandbox.execute("FINAL_VAR(['p'])")
        missing = await sandbox.execute("FINAL_VAR('nope')")
    assert plain.final_answer is None
    assert final.final_answer == "Paris"
    assert by_name.final_answer == "['a', 'b']"
    assert by_value.final_answer == "['p']"
    assert missing.final_answer is None
    assert "variable 'nope' not found" in missing.stdout and "'ans'" in missing.stdout and "'x'" in missing.stdout


async def test_show_vars_lists_only_user_variables():
    async with await Sandbox.create(fast_config(), context="ctx", scaffold_code="def tool():\n    return 1") as sandbox:
        empty = await sandbox.execute("SHOW_VARS()")
        listed = await sandbox.execute("count = 3\nname = 'a'\nSHOW_VARS()")
    assert empty.stdout == "No variables created yet.\n"
    assert listed.stdout == "Available variables: {'count': 'int', 'name': 'str'}\n"


async def test_trailing_expression_is_echoed_unless_disabled():
    async with await Sandbox.create(fast_config()) as sandbox:
        echoed = await sandbox.execute("x = [1, 2]\nlen(x) * 10")
        silent_none = await sandbox.execute("None")
    async with await Sandbox.create(fast_config(echo_last_expression=False)) as sandbox:
        not_echoed = await sandbox.execute("40 + 2")
    assert echoed.stdout == "20\n"
    assert silent_none.stdout == ""
    assert not_echoed.stdout == ""


async def test_reserved_names_are_restored_after_each_execute():
    scaffold = "def search(q):\n    return 'hit:' + q"
    async with await Sandbox.create(fast_config(), context="the context", scaffold_code=scaffold,
                                    handler=_echo_handler) as sandbox:
        hijack = await sandbox.execute(
            "context = 'x'; llm_query = 1; SHOW_VARS = 2; FINAL = None; search = 'gone'\ndel FINAL_VAR")
        after = await sandbox.execute(
            "print(context, llm_query('q'), search('a'), SHOW_VARS())\nFINAL_VAR('context')")
    assert hijack.error is None
    assert after.error is None
    assert after.stdout == "the context echo:{'prompt': 'q'} hit:a No variables created yet.\n"
    assert after.final_answer == "the context"


async def test_scaffold_error_fails_create_with_its_traceback():
    with pytest.raises(SandboxError, match="scaffold failed to load(.|\n)*ZeroDivisionError"):
        await Sandbox.create(fast_config(), scaffold_code="x = 1 / 0")


async def test_errors_show_model_frames_not_worker_internals(backend):
    async with await Sandbox.create(fast_config(backend=backend)) as sandbox:
        result = await sandbox.execute("def f():\n    raise ValueError('boom')\nf()")
        syntax = await sandbox.execute("def broken(:\n    pass")
        unparsable = await run_all(sandbox, "x = " + "-" * 200_000 + "1", "x = 1\0")  # parser limits, a null byte
    assert result.error.startswith("Traceback")
    assert 'File "<repl-1>", line 2, in f' in result.error and "ValueError: boom" in result.error
    assert "worker" not in result.error and "skyrl" not in result.error
    # as Python's own REPL shows it: the block's line, a caret and the message; no parser frames or host paths
    assert syntax.error.splitlines() == ['  File "<repl-2>", line 1', "    def broken(:", "               ^",
                                         "SyntaxError: invalid syntax"]
    for failed in unparsable:
        assert failed.error and "Traceback" not in failed.error and "ast.py" not in failed.error, failed.error


async def test_system_exit_and_keyboard_interrupt_are_reported_not_fatal():
    async with await Sandbox.create(fast_config()) as sandbox:
        await sandbox.execute("kept = 5")
        exits = await run_all(sandbox, "raise SystemExit(3)", "import sys; sys.exit('bye')", "raise SystemExit",
                              "raise KeyboardInterrupt")
        after = await sandbox.execute("print(kept)")
    assert [r.error.splitlines()[-1] for r in exits] == ["SystemExit: 3", "SystemExit: bye", "SystemExit",
                                                         "KeyboardInterrupt"]
    assert not any(r.sandbox_restarted for r in exits)
    assert after.stdout == "5\n"


# --- context ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("context, probe, expected", [
    ("é" * 1_000_000, "print(type(context).__name__, len(context), context[:2])", "str 1000000 éé\n"),
    (["x" * 1000] * 1000, "print(type(context).__name__, len(context), isinstance(context, list))",
     "FrozenList 1000 True\n"),
    ({"paper": {"intro": "y" * 1_000_000}}, "print(len(context['paper']['intro']), list(context))",
     "1000000 ['paper']\n"),
])
async def test_megabyte_context_of_each_kind(context, probe, expected):
    async with await Sandbox.create(fast_config(), context=context) as sandbox:
        result = await sandbox.execute(probe)
    assert result.error is None
    assert result.stdout == expected


async def test_context_is_read_only_but_copies_are_mutable():
    context = {"papers": ["a", "b"], "meta": {"n": 2}}
    async with await Sandbox.create(fast_config(), context=context) as sandbox:
        refused = await run_all(sandbox, "context['x'] = 1", "context['papers'].append('c')",
                                "context['meta'].update(n=3)", "context['papers'] += ['d']")
        copies = await sandbox.execute(
            "import copy, json\nmine = copy.deepcopy(context)\nmine['papers'].append('c')\n"
            "flat = list(context['papers']); flat.append('z')\n"
            "print(mine['papers'], flat, context['papers'], json.dumps(context))")
    assert all("context is read-only" in r.error for r in refused)
    assert copies.error is None
    assert copies.stdout == "['a', 'b', 'c'] ['a', 'b', 'z'] ['a', 'b'] " + json.dumps(context) + "\n"


async def test_context_that_is_not_json_is_refused():
    with pytest.raises(SandboxError, match="context must be JSON data"):
        await Sandbox.create(fast_config(), context={"when": object()})


# --- sub-call requests ------------------------------------------------------------------------------

async def _echo_handler(method: str, params: dict):
    await asyncio.sleep(0)
    if method.endswith("_batched"):
        return [f"echo:{p}" for p in params["prompts"]]
    return f"echo:{params}"


async def test_rpc_stubs_send_named_params_to_the_async_handler():
    calls = []

    async def handler(method, params):
        calls.append((method, params))
        return await _echo_handler(method, params)

    async with await Sandbox.create(fast_config(), handler=handler) as sandbox:
        result = await sandbox.execute(
            "a = llm_query('hi')\n"
            "b = llm_query_batched(['p1', 'p2'])\n"
            "c = rlm_query('sub', {'k': [1]})\n"
            "d = rlm_query_batched(['q1'], context_list=['c1'])\n"
            "print(a); print(b); print(c); print(d)")
    assert result.error is None, result.error
    assert calls == [
        ("llm_query", {"prompt": "hi"}),
        ("llm_query_batched", {"prompts": ["p1", "p2"]}),
        ("rlm_query", {"prompt": "sub", "context": {"k": [1]}}),
        ("rlm_query_batched", {"prompts": ["q1"], "context_list": ["c1"]}),
    ]
    assert result.stdout.splitlines() == ["echo:{'prompt': 'hi'}", "['echo:p1', 'echo:p2']",
                                          "echo:{'prompt': 'sub', 'context': {'k': [1]}}", "['echo:q1']"]


async def test_custom_rpc_methods_and_handler_failures():
    async def handler(method, params):
        if method == "lookup":
            return {"args": params["args"], "limit": params.get("limit")}
        raise ConnectionError("engine down")

    async with await Sandbox.create(fast_config(), rpc_methods=("lookup", "llm_query"), handler=handler) as sandbox:
        custom = await sandbox.execute("print(lookup('a', 2, limit=5))")
        failing = await sandbox.execute("llm_query('x')")
        not_json = await sandbox.execute("llm_query({1, 2})")
        too_many = await sandbox.execute("llm_query('a', 'b', 'c')")
        absent = await sandbox.execute("rlm_query('x')")
    assert custom.stdout == "{'args': ['a', 2], 'limit': 5}\n"
    assert "RuntimeError: llm_query failed: ConnectionError: engine down" in failing.error
    assert "must be JSON data" in not_json.error
    assert "takes at most 2 positional arguments" in too_many.error
    assert "NameError" in absent.error


async def test_rpc_without_handler_raises_a_clear_error_in_model_code():
    async with await Sandbox.create(fast_config()) as sandbox:
        result = await sandbox.execute("llm_query('x')")
    assert "llm_query is not available in this sandbox (no handler)" in result.error


async def test_handler_time_does_not_count_toward_the_execution_timeout():
    async def slow_handler(method, params):
        await asyncio.sleep(1.5)
        return "late"

    async with await Sandbox.create(fast_config(exec_timeout_s=1.0), handler=slow_handler) as sandbox:
        result = await sandbox.execute("print(llm_query('a'), llm_query('b'))")
    assert result.error is None and not result.timed_out
    assert result.stdout == "late late\n"
    assert result.duration_s >= 3.0


async def test_many_sandboxes_waiting_on_subcalls_do_not_block_each_other():
    """All 16 requests must be in flight at once before any is answered: no thread per waiter."""
    count = 16
    arrived = 0
    all_arrived = asyncio.Event()

    async def barrier_handler(method, params):
        nonlocal arrived
        arrived += 1
        if arrived == count:
            all_arrived.set()
        await asyncio.wait_for(all_arrived.wait(), 20)
        return params["prompt"].upper()

    sandboxes = await asyncio.gather(*(Sandbox.create(fast_config(exec_timeout_s=20), handler=barrier_handler)
                                       for _ in range(count)))
    try:
        results = await asyncio.gather(*(s.execute(f"print(llm_query('p{i}'))") for i, s in enumerate(sandboxes)))
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))
    assert [r.stdout for r in results] == [f"P{i}\n" for i in range(count)]


# --- limits, restarts, cancellation --------------------------------------------------------------

async def test_timeout_restarts_the_worker_and_says_state_was_lost(backend):
    async with await Sandbox.create(fast_config(backend=backend, exec_timeout_s=1.0), context="ctx") as sandbox:
        await sandbox.execute("x = 1")
        first_pid = sandbox.pid
        spin = await sandbox.execute("while True:\n    pass")
        after = await sandbox.execute("print(context, 'x' in globals())")
    assert spin.timed_out and spin.sandbox_restarted
    assert "exceeded the 1 s time limit" in spin.error and "every variable" in spin.error
    assert spin.duration_s >= 1.0
    assert after.stdout == "ctx False\n" and not after.sandbox_restarted
    assert await wait_until_gone(first_pid) == []


async def test_output_is_capped_with_a_note_of_how_much_was_cut():
    async with await Sandbox.create(fast_config(max_output_chars=1000)) as sandbox:
        result = await sandbox.execute("print('a' * 5000)\nimport sys; print('b' * 100, file=sys.stderr)")
    assert result.truncated_chars == 5001 + 101 - 1000
    assert result.stdout.startswith("a" * 1000)
    assert f"{result.truncated_chars:,} more characters of output were cut" in result.stdout
    assert result.stderr == ""


# The largest reply the default caps allow: all the output there is room for, a traceback as long as the
# worker keeps, each character outside the BMP (12 bytes in the worker's ASCII-escaped JSON).
LARGEST_REPLY = "print('\U0001F600' * 30_000, end='')\nraise ValueError('\U0001F600' * 50_000)"


async def test_the_largest_reply_the_caps_allow_fits_the_default_message_limit(backend):
    async with await Sandbox.create(fast_config(backend=backend)) as sandbox:
        largest = await sandbox.execute(LARGEST_REPLY)
        answer = await sandbox.execute("FINAL('\U0001F600' * 20_000)")
    assert not largest.sandbox_restarted and largest.stdout.startswith("\U0001F600" * 20_000)
    assert "10,000 more characters of output were cut" in largest.stdout
    assert "ValueError" in largest.error and "traceback shortened" in largest.error
    assert answer.final_answer == "\U0001F600" * 20_000


async def test_the_envs_largest_subcall_request_reaches_the_handler(backend):
    received = []

    async def handler(method, params):
        received.append(params["prompts"])
        return ["ok"] * len(params["prompts"])

    config = RLMReplConfig(sandbox=fast_config(backend=backend, exec_timeout_s=30))
    async with await Sandbox.create(config.sandbox, handler=handler) as sandbox:
        result = await sandbox.execute("print(llm_query_batched(['\U0001F600' * 200_000] * 16))")
    assert result.error is None and result.stdout == str(["ok"] * 16) + "\n"
    assert received == [["\U0001F600" * 200_000] * 16]  # max_batch_size prompts of max_prompt_chars: 38 MB


async def test_cancelled_execute_kills_the_worker_and_next_execute_reports_restart():
    async with await Sandbox.create(fast_config(exec_timeout_s=30)) as sandbox:
        await sandbox.execute("x = 1")
        old_pid = sandbox.pid
        task = asyncio.create_task(sandbox.execute("import time\nwhile True:\n    time.sleep(0.01)"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await sandbox.execute("print('x' in globals())")
    assert after.sandbox_restarted and after.stdout == "False\n"
    assert await wait_until_gone(old_pid) == []


async def test_concurrent_sandboxes_keep_their_own_output():
    sandboxes = await asyncio.gather(*(Sandbox.create(fast_config()) for _ in range(8)))
    try:
        results = await asyncio.gather(*(
            s.execute(f"import time\nfor k in range(20):\n    print({i})\n    time.sleep(0.001)")
            for i, s in enumerate(sandboxes)))
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))
    assert [r.stdout for r in results] == [f"{i}\n" * 20 for i in range(8)]


# --- cleanup ------------------------------------------------------------------------------------------

async def test_close_kills_the_worker_and_removes_its_files_and_is_idempotent(backend):
    sandbox = await Sandbox.create(fast_config(backend=backend), context="c" * 1000)
    await sandbox.execute("open('note.txt', 'w').write('hi')")
    pid, host_dir = sandbox.pid, sandbox._worker.host_dir
    assert session_processes(pid)
    await sandbox.close()
    await sandbox.close()
    assert await wait_until_gone(pid) == []
    assert not host_dir.exists()
    with pytest.raises(SandboxError, match="closed sandbox"):
        await sandbox.execute("1")


PARENT_SCRIPT = textwrap.dedent("""
    import asyncio, sys, time
    from skyrl_rlm_repl.sandbox import Sandbox, SandboxConfig

    async def main():
        sandbox = await Sandbox.create(SandboxConfig(backend=sys.argv[1], pool_size=0))
        await sandbox.execute("x = 1")
        print(sandbox.pid, sandbox._worker.host_dir, flush=True)
        await sandbox.execute("import time\\nwhile True:\\n    time.sleep(0.05)")

    asyncio.run(main())
""")


async def test_worker_dies_when_the_parent_process_is_killed_and_its_files_are_swept(backend):
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, backend], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(parent.stdout.readline), 30)
        worker_pid, host_dir = int(line.split()[0]), Path(line.split()[1])
        await asyncio.sleep(0.3)  # the worker is now inside its sleep loop
        assert session_processes(worker_pid) and host_dir.exists()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert await wait_until_gone(worker_pid) == []
        assert host_dir.parent in sweep_stale_dirs()  # what the next process using sandboxes does first
        assert not host_dir.exists()
    finally:
        parent.kill()
        parent.wait()


# --- configuration ----------------------------------------------------------------------------------

def test_config_rejects_unknown_keys_and_unsafe_values():
    with pytest.raises(ValidationError, match="exec_timout_s(.|\n)*Extra inputs are not permitted"):
        SandboxConfig(exec_timout_s=3)
    with pytest.raises(ValidationError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValidationError, match="backend"):
        SandboxConfig(backend="firecracker")
    assert json.loads(SandboxConfig().model_dump_json())["backend"] == "auto"
    with pytest.raises(ValidationError, match="max_message_mb=1 cannot carry the largest result: "
                                              "max_output_chars=200,000 and max_answer_chars=20,000 need 3"):
        SandboxConfig(max_output_chars=200_000, max_message_mb=1)


async def test_auto_backend_reports_what_it_used():
    async with await Sandbox.create(fast_config(backend="auto")) as sandbox:
        assert sandbox.backend == "bwrap"  # or an error: auto never picks the weaker subprocess backend


async def test_rpc_method_names_must_be_identifiers():
    with pytest.raises(SandboxError, match="not a Python identifier"):
        await Sandbox.create(fast_config(), rpc_methods=("llm query",))


async def test_subcalls_from_threads_started_by_model_code_are_answered_in_order():
    async with await Sandbox.create(fast_config(exec_timeout_s=10), handler=_echo_handler) as sandbox:
        result = await sandbox.execute(
            "import threading\nanswers = {}\n"
            "def ask(i):\n    answers[i] = llm_query_batched([f'q{i}'])[0]\n"
            "threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]\n"
            "[t.start() for t in threads]\n[t.join() for t in threads]\n"
            "print(sorted(answers.items()))")
    assert result.error is None, result.error
    assert result.stdout == str(sorted((i, f"echo:q{i}") for i in range(8))) + "\n"
