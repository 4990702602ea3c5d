"""Run a step's tests in the machine and read the reward, the way Harbor's verifier does.

Before the tests arrive, every process of the agent is killed, and the machine's cgroup must say
that none is left: a process that survives (one that looks dead in ``/proc`` while its threads run,
say) gives reward 0 and the reason, and the tests never run. Then ``/tests``, ``/logs/verifier``
and ``/solution`` are emptied: whatever the agent wrote there (a reward file, a fake test) is gone.
``tests/`` is copied to ``/tests`` only now, and ``bash /tests/test.sh`` runs as the task's verifier
user (root unless the task says otherwise) in a state the agent cannot shape: in ``/tests`` (not the
agent's work directory, unless ``verifier_cwd`` says so), with the base environment plus the task's
verifier ``env``, never the agent shell's, a private ``TMPDIR``, and ``PYTHONSAFEPATH=1`` and
``PYTHONNOUSERSITE=1``, so ``python -m pytest`` imports nothing from the current folder (where an
agent's ``pytest.py`` would run in place of the tests) nor from a user's site folder.
Processes the tests leave are killed before the reward file is read (as root, without following a
symlink). ``reward.txt`` holds one number; ``reward.json`` an object of named numbers, as Harbor
keeps rewards: its ``reward`` key is the reward when present, else the weighted mean of its keys
(:mod:`.rewards` has the rule, the weights and what is refused). A missing or malformed reward
gives 0 and says why; each key's value comes back in :attr:`Verdict.rewards`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from skyrl_sandbox.errors import ProcessesSurvived
from skyrl_sandbox.machine import Machine

from .rewards import parse_reward
from .task import HarborTask, Step

__all__ = ["TESTS_DIR", "VERIFIER_PYTHON_ENV", "Verdict", "parse_reward", "verify"]

# TMPDIR of the tests: a fresh /tmp-like folder holding nothing of the agent's (what it left in /tmp could be
# symlinks that a root test writing there would follow).
VERIFIER_TMP = "/logs/.verifier-tmp"
# First undo what an agent that owns these folders (bwrap) can do to them: a symlink or file in place of a
# folder, and modes that deny root without capabilities the deletion.
_PREPARE = ("chmod u+rwx /logs 2>/dev/null; for d in /tests /logs/verifier /solution; do "
            "if [ -L \"$d\" ] || { [ -e \"$d\" ] && [ ! -d \"$d\" ]; }; then rm -f \"$d\"; fi; done; "
            f"chmod -R u+rwX /tests /logs/verifier /solution {VERIFIER_TMP} 2>/dev/null; "
            "mkdir -p /tests /logs/verifier /solution && "
            "find /tests /logs/verifier /solution -mindepth 1 -delete && chmod 755 /tests /logs /logs/verifier && "
            f"rm -rf {VERIFIER_TMP} && mkdir -m 1777 {VERIFIER_TMP}")
_OUTPUT_TAIL = 4000
_MAX_REWARD_FILE = 64 * 1024
TESTS_DIR = "/tests"
# Python started by the tests finds nothing of the agent's on its path: not the current folder (-m, -c), not a
# user site folder. A task's [verifier] env may set these otherwise.
VERIFIER_PYTHON_ENV = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}


@dataclass(frozen=True)
class Verdict:
    """The outcome of one verification."""

    reward: float
    source: str | None  # "reward.txt" or "reward.json"; None when no reward could be read
    problem: str | None  # why the reward is 0 or was changed, in words
    exit_code: int | None
    timed_out: bool
    output_tail: str
    duration_s: float
    agent_failure: str | None = None  # the agent left the machine in a state the tests cannot be trusted in
    rewards: dict[str, float] = field(default_factory=dict)  # each key of the reward file (see .rewards)


async def verify(machine: Machine, task: HarborTask, step: Step, timeout_s: float, cwd: str = TESTS_DIR,
                 weights: Mapping[str, float] | None = None) -> Verdict:
    """Run the step's tests in ``machine`` (``cwd``: where test.sh starts) and read their reward.

    ``weights`` weight the keys of a ``reward.json`` without a ``reward`` key (None: equal weights).
    """
    started = time.monotonic()
    try:
        await machine.kill_processes()
    except ProcessesSurvived as exc:
        return _survived(exc, "before the tests: they were not run", started)
    prepared = await machine.exec(["sh", "-c", _PREPARE], cwd="/", timeout_s=60)
    if not prepared.ok:
        raise RuntimeError(f"could not prepare /tests and /logs/verifier: {prepared.stderr.decode(errors='replace')}")
    user = step.verifier_user or "root"
    if user not in ("root", "0"):
        await machine.exec(["chown", user, "/logs/verifier", VERIFIER_TMP], cwd="/", timeout_s=30)
    await machine.put_files(TESTS_DIR, task.test_files(step))
    environment = {"TMPDIR": VERIFIER_TMP, **VERIFIER_PYTHON_ENV, **step.verifier_env}
    try:
        result = await machine.exec(["bash", f"{TESTS_DIR}/test.sh"], user=user, env=environment, cwd=cwd,
                                    timeout_s=timeout_s, max_output_bytes=_OUTPUT_TAIL * 4)
        await machine.kill_processes()
    except ProcessesSurvived as exc:
        return _survived(exc, "after the tests ran: whatever they wrote is not trusted", started)
    reward_txt = await machine.read_file("/logs/verifier/reward.txt", _MAX_REWARD_FILE)
    reward_json = None if reward_txt is not None else await machine.read_file("/logs/verifier/reward.json",
                                                                               _MAX_REWARD_FILE)
    reading = parse_reward(reward_txt, reward_json, weights)
    reward, source, problem, rewards = reading.reward, reading.source, reading.problem, reading.rewards
    # The next step of a multi-step task must not see these tests or their results.
    await machine.exec(["sh", "-c", _PREPARE], cwd="/", timeout_s=60)
    if result.timed_out:  # unfinished tests pass nothing, whatever reward they wrote before they were killed
        reward, source, rewards = 0.0, None, {}
        problem = f"the tests ran past their timeout ({timeout_s:g} s) and were killed: reward 0" + (
            f"; {problem}" if problem else "")
    output = (result.stdout + result.stderr).decode("utf-8", "replace")
    return Verdict(reward, source, problem, result.exit_code, result.timed_out, output[-_OUTPUT_TAIL:],
                   time.monotonic() - started, rewards=rewards)


def _survived(exc: ProcessesSurvived, when: str, started: float) -> Verdict:
    problem = f"processes in the machine survived being killed {when}: reward 0 ({exc})"
    return Verdict(0.0, None, problem, None, False, "", time.monotonic() - started, agent_failure=problem)
