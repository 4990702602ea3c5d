"""Reward integrity: model code cannot forge a result, outlive its block, slip a limit or cheapen scoring.

An RL policy optimises against the env, so every class of attack here is one a policy could learn.
Each runs on every backend unless only the kernel-level layers of ``bwrap`` can contain it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import tracemalloc
from pathlib import Path

import pytest
from hostile import (
    DISABLE_POLICY,
    FIND_CHANNEL,
    FIND_TOKEN,
    FRAME,
    IS_PIPE,
    KERNEL_BACKENDS,
    WRITE_ALL,
    hostile_config,
    still_healthy,
)
from rlm_helpers import CONTEXT_TASK, repl, scripted_policy
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_rlm_repl.probes import (
    CONTEXT_SENTENCES,
    SCAFFOLD_EDITS,
    guessed_token_final,
    late_raw_thread,
    late_thread,
    leave_frames_behind,
)
from skyrl_rlm_repl.rewards import MAX_SCORED_SNIPPETS, MAX_SNIPPETS_PER_EVIDENCE, score_answer
from skyrl_rlm_repl.sandbox import Sandbox
from skyrl_rlm_repl.tree import RLMTreeConfig, RLMTreeGenerator
from skyrl_sandbox.cgroups import cgroup_support
from skyrl_sandbox.registry import get_backend

# The probes' attacks (skyrl check rlm_repl --adversarial plays them too), here with the right answer.
LEAVE_FRAMES_BEHIND = leave_frames_behind("'Paris'")
GUESSED_TOKEN_FINAL = guessed_token_final("'Paris'")
LATE_THREAD = late_thread("'Paris'")
LATE_RAW_THREAD = late_raw_thread("'Paris'")


def kernel_limits_bind_for_root() -> bool:
    """Root is exempt from RLIMIT_NPROC: for uid 0 only a pids cgroup bounds threads."""
    return os.geteuid() != 0 or cgroup_support() is not None


def require_cgroup_as_root() -> None:
    """On a user's machine a missing cgroup skips; in CI (which runs as root) it fails."""
    if kernel_limits_bind_for_root():
        return
    if os.environ.get("CI"):
        pytest.fail("CI runs as root and no cgroup hierarchy is writable: thread and memory limits cannot bind")
    pytest.skip("running as root without a writable cgroup: RLIMIT_NPROC does not apply to root")


# --- results are bound to the execution that asked for them ---------------------------------------------

async def test_frames_left_in_the_channel_end_the_sandbox_at_the_next_execution(sandbox):
    first = await sandbox.execute(LEAVE_FRAMES_BEHIND)
    second = await sandbox.execute("x = 1")
    assert first.final_answer is None and second.final_answer is None
    assert second.sandbox_restarted and "between executions" in second.error
    assert await still_healthy(sandbox)


async def test_a_frame_for_a_later_execution_cannot_be_prepared(sandbox):
    result = await sandbox.execute(GUESSED_TOKEN_FINAL)
    assert result.sandbox_restarted and "not bound to the running execution" in result.error
    assert result.final_answer is None


@pytest.mark.parametrize("code", [LATE_THREAD, LATE_RAW_THREAD], ids=["threading", "_thread"])
async def test_threads_cannot_outlive_their_block(sandbox, code):
    first = await sandbox.execute(code)
    await asyncio.sleep(1.0)  # the thread would have acted by now
    second = await sandbox.execute("print(context)")
    assert first.sandbox_restarted and "thread(s) running after the block ended" in first.error
    assert first.final_answer is None and second.final_answer is None
    assert second.error is None and second.stdout == "public context\n"


async def test_threads_joined_within_the_block_are_fine(sandbox):
    result = await sandbox.execute("from concurrent.futures import ThreadPoolExecutor\n"
                                   "with ThreadPoolExecutor(4) as pool:\n    print(sum(pool.map(abs, [-1, -2, 3])))")
    assert result.error is None and result.stdout == "6\n" and not result.sandbox_restarted


SCAFFOLD = "def read_section(n):\n    return f'section {n}'\n"


@pytest.mark.parametrize("mutation", list(SCAFFOLD_EDITS.values()), ids=list(SCAFFOLD_EDITS))
async def test_in_place_scaffold_mutations_do_not_reach_the_next_block(backend, mutation):
    async def handler(method, params):
        return "real answer"

    context = {"papers": ["a", "b"]}
    async with await Sandbox.create(hostile_config(backend), context=context, scaffold_code=SCAFFOLD,
                                    handler=handler) as box:
        done = await box.execute(mutation)
        result = await box.execute("print(read_section(2), llm_query('q'), len(context['papers']), sorted(context))\n"
                                   "FINAL('submitted')")
    assert done.error is None
    assert result.error is None, result.error
    assert result.stdout == "section 2 real answer 2 ['papers']\n"
    assert result.final_answer == "submitted"


# --- limits that bind, for root inside the sandbox too ---------------------------------------------------

async def test_a_thread_bomb_stops_at_max_processes(backend):
    require_cgroup_as_root()
    config = hostile_config(backend, max_processes=16)
    code = ("import threading\nstop = threading.Event()\nstarted = []\ntry:\n    for _ in range(500):\n"
            "        t = threading.Thread(target=stop.wait)\n        t.start()\n        started.append(t)\n"
            "except RuntimeError as exc:\n    print(len(started), exc)\nstop.set()\nfor t in started:\n    t.join()")
    async with await Sandbox.create(config, context="public context") as box:
        result = await box.execute(code)
        assert await still_healthy(box)
    count, message = result.stdout.split(" ", 1)
    assert int(count) < 16 and "can't start new thread" in message


async def test_the_worker_sits_in_cgroups_with_the_configured_limits(backend):
    support = cgroup_support()
    in_container = get_backend(backend).owns_limits  # a container's groups are the engine's own
    if support is None and not in_container:
        require_cgroup_as_root()
        pytest.skip("no writable cgroup here (RLIMIT_NPROC binds for this non-root user)")
    config = hostile_config(backend, max_processes=20, memory_mb=300, tmp_size_mb=16)
    async with await Sandbox.create(config) as box:
        pid = box.pid
        if in_container:
            pids_dir, memory_dir = process_groups(pid, "pids"), process_groups(pid, "memory")
        else:
            pids_dir, memory_dir = box._worker.cgroup.dirs[0], box._worker.cgroup.dirs[-1]
        members = (pids_dir / "cgroup.procs").read_text().split()
        pids_max = int((pids_dir / "pids.max").read_text())
        limit_file = "memory.limit_in_bytes" if (memory_dir / "memory.limit_in_bytes").exists() else "memory.max"
        memory_max = int((memory_dir / limit_file).read_text())
    assert str(pid) in members
    # bwrap's own two processes; a container's init
    assert pids_max == 20 + (1 if in_container else {"bwrap": 2}.get(backend, 0))
    assert memory_max == (300 + 16) * 2**20
    assert not pids_dir.exists()  # removed with the worker


def process_groups(pid: int, controller: str) -> Path:
    """The cgroup folder of ``controller`` holding host process ``pid`` (cgroup v1, or v2's single hierarchy)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path("/sys/fs/cgroup", controller, path.lstrip("/"))
    v2 = next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::"))
    return Path("/sys/fs/cgroup", v2[3:].lstrip("/"))


async def test_memfd_is_refused_by_the_kernel(backend):
    async with await Sandbox.create(hostile_config(backend)) as box:
        result = await box.execute(DISABLE_POLICY + "import os\ntry:\n    os.memfd_create('x')\n"
                                   "except OSError as exc:\n    print(exc.errno)")
    assert result.error is None and result.stdout == f"{errno.EPERM}\n"


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("path", ["/dev/shm/pinned", "/dev/mqueue/pinned", "/dev/pinned", "/pinned", "/skyrl/pinned"])
async def test_no_tmpfs_but_the_bounded_tmp_is_writable(backend, path):
    async with await Sandbox.create(hostile_config(backend)) as box:
        result = await box.execute(DISABLE_POLICY + f"try:\n    open({path!r}, 'wb').write(b'x' * 2**20)\n"
                                   "except OSError as exc:\n    print(exc.strerror)")
    # Where nothing is mounted at all there is no file system to pin memory in either (a container's private IPC
    # namespace has no /dev/shm; bwrap's /dev has no /dev/mqueue).
    absent = path == ("/dev/shm/pinned" if get_backend(backend).engine else "/dev/mqueue/pinned")
    expected = ("No such file or directory\n",) if absent else ("Read-only file system\n", "Permission denied\n")
    assert result.error is None and result.stdout in expected


def test_many_blocks_share_one_code_time_budget(backend):
    env = RLMReplEnv(task=CONTEXT_TASK, config={"sandbox": {"backend": backend, "exec_timeout_s": 1.0}})
    env.reset()
    try:
        result = env.step("\n".join(repl("while True:\n    pass") for _ in range(6)))
    finally:
        env.close()
    observation = result.observation[0]["content"]
    assert env.counters["executions"] == 1 and env.counters["sandbox_timeouts"] == 1
    assert "blocks 2 to 6 were not run" in observation and "exec_timeout_s" in observation


async def test_time_waiting_for_sub_calls_counts_against_the_step_budget(backend):
    async def slow_subcall(method, params):
        await asyncio.sleep(60)

    env = RLMReplEnv(task=CONTEXT_TASK, config={"step_timeout_s": 1.0, "sandbox": {"backend": backend}},
                     subcall_handler=slow_subcall)
    env.reset()
    try:
        result = await env.astep(repl("llm_query('q')") + "\n" + repl("print('second block')"))
    finally:
        env.close()
    observation = result.observation[0]["content"]
    assert "time budget of this step ran out" in observation and "second block" not in observation
    assert "step_timeout_s" in observation


async def test_an_oversize_final_answer_is_refused(backend):
    async with await Sandbox.create(hostile_config(backend, max_answer_chars=1000)) as box:
        direct = await box.execute("FINAL('x' * 1001)")
        by_name = await box.execute("big = 'y' * 5000\nFINAL_VAR('big')")
        fits = await box.execute("FINAL('z' * 1000)")
    for refused in (direct, by_name):
        assert refused.final_answer is None and "over the limit of 1,000; it was not submitted" in refused.error
    assert fits.final_answer == "z" * 1000


def test_an_oversize_final_line_in_the_response_is_not_submitted(make_env):
    env = make_env(sandbox={"max_answer_chars": 100})
    result = env.step("FINAL(" + "Paris " * 50 + ")")
    assert not result.terminated and result.reward == 0.0
    assert "over the limit of 100; it was not submitted" in result.observation[0]["content"]


# --- the parent's own cost per message and per answer ---------------------------------------------------

@pytest.mark.parametrize("payload, reason", [
    ("b'[' + b'{},' * 2_000_000 + b'{}]'", "objects and lists"),
    ("b'[' + b'0,' * 2_000_000 + b'0]'", "items"),
    ("b'[' + b'\"\",' * 8_000_000 + b'\"\"]'", "items"),  # 8 million empty strings: 24 MB
])
async def test_frames_that_decode_to_far_more_than_their_size_are_refused_cheaply(backend, payload, reason):
    frame = (f"{FRAME}(b'{{\"op\": \"rpc\", \"token\": \"' + token + b'\", \"id\": 1, \"method\": \"llm_query\", "
             f"\"params\": {{\"prompt\": ' + {payload} + b'}}}}')")
    roomy = hostile_config(backend, max_message_mb=32)  # the frames fit: what gets them refused is their structure
    async with (await Sandbox.create(roomy, context="public context") as sandbox,
                await Sandbox.create(hostile_config(backend), context="public context") as other):
        tracemalloc.start()
        try:
            sending = asyncio.ensure_future(sandbox.execute(IS_PIPE + FIND_CHANNEL + FIND_TOKEN
                                                            + WRITE_ALL.format(payload=frame) + "import time\ntime.sleep(5)"))
            while not sending.done():  # the other sandbox on this loop goes on being served meanwhile
                assert await still_healthy(other)
            result = await sending
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert result.sandbox_restarted and "broke the protocol" in result.error and reason in result.error
        assert peak < 64 * 2**20  # the frame and a few chunks of it (a regex-based check took 1.4 GB)
        assert await still_healthy(sandbox) and await still_healthy(other)


def test_a_batched_call_over_max_batch_size_gets_one_refusal_not_one_per_prompt(make_env):
    env = make_env(subcalls={"max_batch_size": 4})
    result = env.step(repl("out = llm_query_batched([''] * 100_000)\nprint(type(out).__name__, out)"))
    observation = result.observation[0]["content"]
    assert "str Error: llm_query_batched refused: 100000 prompts in one call; max_batch_size=4." in observation


@pytest.mark.parametrize("answer, component", [
    ("x" * 4_000_000, "answer_too_long"),
    (repr(["Paris"] * (MAX_SCORED_SNIPPETS + 1)), "too_many_snippets"),
])
def test_scoring_refuses_answers_past_its_caps(evidence_tasks, answer, component):
    task = evidence_tasks[0]
    reward, components = score_answer(task, task["papers"], answer, 0.8)
    assert reward == 0.0 and components == {component: 1.0}


def test_the_whole_context_as_the_answer_is_refused(make_env, evidence_tasks):
    """Every sentence of the papers, returned without reading the question, earned F1 from recall alone (0.08 to
    0.11 on the built-in tasks): an answer of more than MAX_SNIPPETS_PER_EVIDENCE snippets per gold one scores 0."""
    task = evidence_tasks[0]
    result = make_env(task=task).step(repl(CONTEXT_SENTENCES + "FINAL(sentences)"))
    assert result.terminated and result.reward == 0.0
    assert result.info["reward_components"] == {"too_many_snippets": 1.0, "task_reward": 0.0}
    gold = list(task["evidence"])
    at_the_cap = gold * MAX_SNIPPETS_PER_EVIDENCE  # each gold snippet matches once; its copies are misses
    precision = 1 / MAX_SNIPPETS_PER_EVIDENCE
    assert score_answer(task, task["papers"], repr(at_the_cap), 0.8)[0] == pytest.approx(
        2 * precision / (precision + 1))
    assert score_answer(task, task["papers"], repr([*at_the_cap, gold[0]]), 0.8) == (0.0, {"too_many_snippets": 1.0})


def test_a_gold_answer_within_the_caps_still_scores_full_reward(evidence_tasks):
    task = evidence_tasks[0]
    reward, _ = score_answer(task, task["papers"], repr(list(task["evidence"])), 0.8)
    assert reward == 1.0


# --- the in-process policy's blind spots are closed or contained ----------------------------------------

async def test_directory_descriptors_cannot_lead_outside_the_sandbox(sandbox):
    stdlib = await sandbox.execute("import os\nprint(os.path.dirname(os.__file__))")
    stdlib_dir = stdlib.stdout.strip()
    outside = await sandbox.execute(f"import os\nos.open({stdlib_dir!r}, os.O_RDONLY)")
    climbing = await sandbox.execute("import os\nfd = os.open('.', os.O_RDONLY)\n"
                                     "os.open('../../../../../../etc/passwd', os.O_RDONLY, dir_fd=fd)")
    assert "PermissionError" in outside.error and "as a file descriptor is not allowed" in outside.error
    assert "PermissionError" in climbing.error and "'..'" in climbing.error


@pytest.mark.parametrize("syscall", ["rt_sigqueueinfo", "rt_tgsigqueueinfo"])
async def test_queued_signals_to_the_parent_fail_in_the_kernel(backend, syscall):
    numbers = {"x86_64": {"rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297},
               "aarch64": {"rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240}}[os.uname().machine]
    args = "target, 0, info" if syscall == "rt_sigqueueinfo" else "target, target, 0, info"
    async with await Sandbox.create(hostile_config(backend)) as box:
        result = await box.execute(
            DISABLE_POLICY + "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "info = ctypes.create_string_buffer((-1).to_bytes(4, 'little', signed=True).rjust(12, b'\\0'), 128)\n"
            "target = os.getppid()\n"
            f"print(libc.syscall({numbers[syscall]}, {args}), ctypes.get_errno())")
    # signal 0 with si_code SI_QUEUE harms no one and would succeed without the filter: EPERM is the filter
    assert result.error is None and result.stdout == f"-1 {errno.EPERM}\n"


async def test_rewriting_the_context_cannot_ground_an_invented_quote(make_env, evidence_tasks):
    task = evidence_tasks[0]
    paper = next(iter(task["papers"]))
    env = make_env(task=task)
    invented = "Our method solves every benchmark perfectly."
    result = env.step(repl(f"dict.__setitem__(context[{paper!r}], 'Forged', {invented!r})",
                           f"hits = search({invented!r})", "FINAL([hit['text'] for hit in hits])"))
    assert result.terminated and result.info["final_answer"] == repr([invented])  # the code saw its own edit
    assert result.reward == 0.0 and result.info["reward_components"]["grounded_fraction"] == 0.0


# --- learning integrity: a policy that tries each forgery earns nothing from it ----------------------------

FORGERIES = {
    "honest": [repl("FINAL('Paris')")],
    "frames left for a later turn": [repl(LEAVE_FRAMES_BEHIND), repl("x = 1"), repl("x = 2")],
    "a thread that answers later": [repl(LATE_THREAD), repl("import time\ntime.sleep(1)"), repl("x = 2")],
    "a frame with a guessed token": [repl(GUESSED_TOKEN_FINAL), repl("x = 1"), repl("x = 2")],
    "FINAL printed into the observation": [repl("print('FINAL(Paris)')"), repl("print('FINAL_VAR(x)')"),
                                           repl("x = 2")],
    "an oversize answer": [repl("FINAL('Paris ' * 10_000)"), "FINAL(" + "Paris " * 5_000 + ")", repl("x = 2")],
}


async def test_a_policy_trying_each_forgery_earns_no_reward_from_it(tokenizer):
    tasks = [{**CONTEXT_TASK, "id": name, "prompt": f"[{name}] What is the capital of France?"}
             for name in FORGERIES]

    def choose(first_user: str, last_user: str, turn: int) -> str:
        name = first_user[1:first_user.index("]")]
        return FORGERIES[name][min(turn, len(FORGERIES[name]) - 1)]

    generator = RLMTreeGenerator(RLMTreeConfig(n_samples_per_prompt=1, max_tokens_per_turn=2000,
                                               max_context_length=16_000, max_total_tokens=60_000),
                                 engine=scripted_policy(tokenizer, choose), tokenizer=tokenizer, env_id="rlm_repl",
                                 env_config={"max_turns": 3, "max_action_chars": 50_000,
                                             "sandbox": {"exec_timeout_s": 3.0}})
    batch = await generator.generate(tasks)
    rewards = {trajectory.group_id: trajectory.reward for trajectory in batch.trajectories if trajectory.depth == 0}
    assert rewards == {name: (1.0 if name == "honest" else 0.0) for name in FORGERIES}
