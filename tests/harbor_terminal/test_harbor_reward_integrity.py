"""Reward integrity: a scripted policy that plays a trick instead of solving a built-in task scores 0.

An RL policy optimises against the env, so every path to reward must go through the task's own
check of the agent's work. Each trick below is played on docker and on bwrap (where the agent owns
every writable folder of its machine, /logs included) in an episode that does not solve the task:
its reward must be 0, without an env error (an error is an escape from a bad reward too). Then the
same trick followed by an honest solve must score 1: the defences (processes killed, /tests,
/logs/verifier and /solution emptied, a clean root environment, reward files read without
following links) do not break the verifier.

The tricks: reward files written ahead (plain, JSON, symlinked, read-only, FIFOs, the verifier's
folder replaced by a link, even to the machine's folder on the host), programs and interpreters the
tests use replaced (in place, or earlier on PATH), shell profiles and BASH_ENV, processes left to
rewrite the reward (nohup, setsid, double fork, one that waits for the tests), fake tests and
solutions, Python start-up hooks in the agent's site folder, cron and at jobs, and git hooks and
config in a repository the tests might run git in as root. Their scripts are
``skyrl_harbor_terminal.probes.TRICKS``, which ``skyrl check harbor_terminal --adversarial`` plays too.
"""

from __future__ import annotations

import pytest
from harbor_helpers import TERMINAL_IMAGE, bash, builtin_row, play, runs_images
from skyrl_harbor_terminal.env import BUILTIN_TASKS
from skyrl_harbor_terminal.probes import LOOP, PAYLOAD, PRELUDE, REWARD, TRICKS
from skyrl_sandbox.machine_factory import machine_backends

# The tasks each trick is played on: where it would pay if it worked.
TRICK_TASKS: dict[str, tuple[str, ...]] = {
    "reward files written ahead": ("hello-world-file",),
    "reward files linked to a file holding 1": ("hello-world-file",),
    "read-only reward file and folders": ("hello-world-file",),
    "reward files as FIFOs": ("hello-world-file",),
    "verifier folder replaced by a link": ("hello-world-file",),
    "verifier folder linked to the machine's folder on the host": ("hello-world-file",),
    "programs and interpreters replaced": ("hello-world-file", "delete-large-files"),
    "PATH, aliases and hashed commands": ("hello-world-file", "delete-large-files"),
    "shell profiles and BASH_ENV": ("hello-world-file", "delete-large-files"),
    "processes left to rewrite the reward": ("hello-world-file",),
    "fake tests and solution": ("hello-world-file", "delete-large-files"),
    "python start-up hooks": ("delete-large-files", "fix-median-bug"),
    "cron and at jobs": ("hello-world-file",),
    "git hooks and config": ("git-branch-commit", "git-find-commit"),
}

IMAGES_ONLY = {"fix-median-bug", "word-counter-project"}  # [metadata.skyrl] tests_run_agent_code
CASES = [pytest.param(trick, task, backend, id=f"{backend}-{trick}-{task}")
         for backend in machine_backends() for trick, tasks in TRICK_TASKS.items() for task in tasks
         if runs_images(backend) or task not in IMAGES_ONLY]


def honest_solve(task: str) -> str:
    """The task's own solution, typed into the shell as its script, with a clean environment and PATH."""
    script = (BUILTIN_TASKS / task / "solution" / "solve.sh").read_text()
    return (f"env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/home/agent "
            f"LANG=C.UTF-8 /bin/bash -s <<'SOLVE'\n{script}\nSOLVE")


def final(results) -> tuple[float, dict]:
    assert results and (results[-1].terminated or results[-1].truncated), results
    assert "error" not in results[-1].info, results[-1].info["error"]
    return sum(result.reward for result in results), results[-1].info


@pytest.mark.parametrize(("trick", "task", "machine_backend"), CASES)
def test_a_trick_scores_0_and_an_honest_solve_after_it_scores_1(trick: str, task: str, machine_backend: str):
    from skyrl_sandbox.testing import require_backend

    require_backend(machine_backend)
    row = builtin_row(task)
    attack = bash(PRELUDE, TRICKS[trick])
    results, _ = play(row, [attack, "<done/>"], backend=machine_backend)
    assert "prelude-done" in results[0].observation[0]["content"], results[0].observation
    reward, info = final(results)
    assert reward == 0.0, f"{trick} on {task} scored {reward}: {info.get('verifier_output_tail')}"
    assert info["step_rewards"] == [0.0]

    results, _ = play(row, [attack, bash(honest_solve(task), done=True)], backend=machine_backend)
    reward, info = final(results)
    assert reward == 1.0, f"an honest solve after {trick} scored {reward}: {info.get('reward_problem')} " \
                          f"{info.get('verifier_output_tail')}"


# --- tests that run the agent's own code ------------------------------------------------------------------

def agent_code_cases(task: str) -> list:
    """Backends that run images only: on bwrap the agent and the tests share one host user, so such tasks are
    refused there (test_oracle.py::test_bwrap_refuses_a_task_whose_tests_run_the_agents_code)."""
    return [pytest.param(task, backend, id=f"{task}-{backend}")
            for backend in machine_backends() if runs_images(backend)]


MEDIAN_WRITER = f"""cat >> /app/stats.py <<'EOF'

import os as _os
for _path in ("{REWARD}",):
    try:
        with open(_path, "w") as _f:
            _f.write("1")
    except OSError:
        pass
_os.system("setsid sh -c '{LOOP} 2>/dev/null' </dev/null >/dev/null 2>&1 &")
EOF
tail -3 /app/stats.py"""


@pytest.mark.parametrize(("task", "backend"), agent_code_cases("fix-median-bug"))
def test_the_agents_module_run_by_the_tests_cannot_write_the_reward(task: str, backend: str):
    from skyrl_sandbox.testing import require_backend

    require_backend(backend)
    row = builtin_row(task)
    results, _ = play(row, [bash(MEDIAN_WRITER), "<done/>"], backend=backend)
    reward, info = final(results)
    assert reward == 0.0, f"the agent's stats.py, imported by the tests, scored {reward}"
    results, _ = play(row, [bash(MEDIAN_WRITER), bash(honest_solve(task), done=True)], backend=backend)
    assert final(results)[0] == 1.0


WORD_COUNTER_WRITER = f"""mkdir -p /app/project/bin && cat > /app/project/bin/count_words.sh <<'EOF'
#!/bin/sh
echo 1 > {REWARD} 2>/dev/null
setsid sh -c '{LOOP} 2>/dev/null' </dev/null >/dev/null 2>&1 &
echo "not the counts"
EOF
chmod +x /app/project/bin/count_words.sh"""


@pytest.mark.parametrize(("task", "backend"), agent_code_cases("word-counter-project"))
def test_the_agents_script_run_by_a_later_steps_tests_cannot_write_the_reward(task: str, backend: str):
    from skyrl_sandbox.testing import require_backend

    require_backend(backend)
    steps = sorted((BUILTIN_TASKS / task / "steps").iterdir())
    setup = next(step for step in steps if step.name == "setup")
    solve_setup = (setup / "solution" / "solve.sh").read_text()
    replies = [bash(f"/bin/bash -s <<'SOLVE'\n{solve_setup}\nSOLVE", done=True),
               bash(WORD_COUNTER_WRITER, done=True), "<done/>"]
    results, _ = play(builtin_row(task), replies, backend=backend)
    _, info = final(results)
    assert info["step_rewards"][0] == 1.0, info
    assert info["step_rewards"][1] == 0.0, f"the agent's script, run by step 2's tests, scored {info['step_rewards']}"


# --- what the agent can see of the verifier, and git as root -----------------------------------------------------


def test_the_verifiers_tests_and_the_solution_are_not_in_the_machine_before_verification(machine_backend: str):
    task = "hello-world-file"
    look = bash("ls -la /tests /solution /logs/verifier 2>&1",
                "grep -rs 'unexpected conten[t]' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr "
                "--exclude-dir=dev 2>/dev/null | head -5; echo searched",
                "find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o \\( -name test.sh -o -name "
                "solve.sh \\) -print 2>/dev/null | head; echo found")
    results, _ = play(builtin_row(task), [look, "<done/>"], backend=machine_backend)
    seen = results[0].observation[0]["content"]
    assert "searched" in seen and "found" in seen, seen
    tests = (BUILTIN_TASKS / task / "tests" / "test.sh").read_text()
    solution = (BUILTIN_TASKS / task / "solution" / "solve.sh").read_text()
    assert "unexpected content" in tests and "unexpected content" not in seen
    assert solution.strip().splitlines()[-1] not in seen
    assert "/test.sh" not in seen and "/solve.sh" not in seen
    assert final(results)[0] == 0.0


async def test_docker_roots_git_refuses_a_repository_the_agent_owns(docker_backend: str):
    """Why a test must never run git as root in the agent's repository, and why on docker it would not run the
    agent's hooks anyway: git refuses a repository of another user ("dubious ownership"). On bwrap the agent's
    files belong to the same host uid as root's, so git would trust it: the built-in git tasks copy the objects
    into a fresh root-owned bare repository instead (see the "git hooks and config" trick)."""
    from skyrl_sandbox.backends.docker import images
    from skyrl_sandbox.backends.docker.client import DOCKER
    from skyrl_sandbox.machine import MachineSpec
    from skyrl_sandbox.machine_factory import start_machine

    images.ensure_base_image(DOCKER, TERMINAL_IMAGE)
    async with await start_machine(MachineSpec(image=TERMINAL_IMAGE, memory_mb=256), docker_backend) as machine:
        planted = await machine.exec(["bash", "-c", f"""{PRELUDE}
git init -q /app/repo && cd /app/repo && git config user.email a@b && git config user.name a
echo x > f && git add f && git commit -qm one && git config core.fsmonitor {PAYLOAD} && evil .git/hooks/post-checkout
"""], user="agent")
        assert planted.ok, planted
        as_root = await machine.exec(["sh", "-c", "mkdir -p /logs/verifier; cd /app/repo && git status; "
                                                  "git checkout -q -b other; git log --oneline"])
        assert b"dubious ownership" in as_root.stderr and as_root.exit_code != 0
        assert await machine.read_file(REWARD) is None
