"""A hostile policy against harbor_terminal: every trick scores 0, is scored (never an env error), leaves nothing.

Each class of attack an RL policy finds against a terminal env, played as a scripted policy on
docker and on bwrap:

- a process that outlives the kill before the tests (a thread-group leader that exited while its
  thread runs: a zombie in ``/proc``) and writes what the tests compare against once ``/tests``
  appears; and a process that really cannot be killed, which must give reward 0 and the reason;
- modules left in the work directory that ``python -m`` would run in place of the tests;
- turning a bad episode into an env error, which drops it from training: a FIFO where the shell
  reads its history, a work directory made unenterable, a process name that shifts the fields of
  a root-side ``/proc/<pid>/stat`` parse (a confused deputy), a root agent that stops its container;
- leaks: an image ``VOLUME``, folders the agent made undeletable, as root and as an unprivileged trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harbor_helpers import TERMINAL_IMAGE, bash, builtin_row, play, runs_images, write_task
from skyrl_harbor_terminal.probes import ESCAPES, SHADOWS, survivor

HELLO = "printf 'Hello, world!\\n' > /app/hello.txt"
# A survivor that writes the output hello-world-file's tests check, once the tests arrive.
SURVIVOR = survivor("/app/hello.txt", "Hello, world!\n")


def scored(results) -> tuple[float, dict]:
    """The episode's reward and last info; it must have ended as a scored episode, not an env error."""
    assert results and (results[-1].terminated or results[-1].truncated), results
    info = results[-1].info
    assert "error" not in info, f"the agent turned its episode into an env error: {info['error']}"
    return sum(result.reward for result in results), info


def said(result) -> str:
    return "\n".join(message["content"] for message in result.observation)


# --- 1. processes that outlive the kill -----------------------------------------------------------------------


def test_a_survivor_that_looks_dead_in_proc_is_killed_before_the_tests(machine_backend: str):
    results, _ = play(builtin_row("hello-world-file"), [bash(SURVIVOR), "<done/>"], backend=machine_backend)
    assert "leader Z threads 2" in said(results[0]), said(results[0])  # the trick is in place: a zombie leader
    reward, info = scored(results)
    assert reward == 0.0, f"the survivor wrote the answer after the kill: {info.get('verifier_output_tail')}"
    assert "missing" in info["verifier_output_tail"]


def freezer_group(pid: int) -> Path:
    line = next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if "freezer" in line.split(":")[1].split(","))
    return Path("/sys/fs/cgroup/freezer") / line.split(":", 2)[2].lstrip("/")


def host_pid_of(machine, argv0: bytes) -> int:
    """The host pid of the agent's process running ``argv0`` in ``machine`` (waits for its exec)."""
    from skyrl_sandbox import cgroups

    for _ in range(500):
        members = cgroups.members(machine._group) - machine._spared if runs_images(machine.backend) \
            else machine.cgroup.members()
        for pid in members:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(argv0 + b"\0"):
                    return pid
        time.sleep(0.01)
    raise AssertionError(f"no {argv0!r} in the machine")


@pytest.mark.slow  # ~10 s a backend
async def test_a_process_that_cannot_be_killed_gives_reward_0_and_the_reason_without_running_the_tests(
        machine_backend: str, tmp_path: Path):
    """The kill is proven by the cgroup's own list, not assumed: a process it cannot kill (here pinned by the test
    in a frozen child group, which no agent can do) is named, and the tests (which would pay 1) never run."""
    from skyrl_harbor_terminal.task import load_task
    from skyrl_harbor_terminal.verifier import verify
    from skyrl_sandbox.machine import MachineSpec
    from skyrl_sandbox.machine_factory import start_machine

    if not Path("/sys/fs/cgroup/freezer/cgroup.procs").exists():
        pytest.skip("pinning a process needs the cgroup v1 freezer (/sys/fs/cgroup/freezer)")
    row = write_task(tmp_path / "pays", {"tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"})
    task = load_task(row["task_path"])
    spec = MachineSpec(image=TERMINAL_IMAGE if runs_images(machine_backend) else None, memory_mb=256)
    async with await start_machine(spec, machine_backend) as machine:
        shell = await machine.open_shell()
        await shell.run("sleep 1000 & echo started", 10)
        sleeper = host_pid_of(machine, b"sleep")
        pinned = freezer_group(sleeper) / f"pinned-{os.getpid()}"
        pinned.mkdir()
        try:
            (pinned / "cgroup.procs").write_text(str(sleeper))
            (pinned / "freezer.state").write_text("FROZEN")
            verdict = await verify(machine, task, task.steps[0], 20)
        finally:
            (pinned / "freezer.state").write_text("THAWED")  # the kill it holds pending now ends it
            with contextlib.suppress(ProcessLookupError):
                os.kill(sleeper, signal.SIGKILL)
            while (pinned / "cgroup.procs").read_text().strip():
                time.sleep(0.01)
            pinned.rmdir()
    assert verdict.reward == 0.0 and verdict.source is None
    assert verdict.agent_failure and f"{sleeper}" in verdict.agent_failure and "before the tests" in verdict.problem


# --- 2. the verifier's start cannot be shaped ------------------------------------------------------------------

SHADOW_TEST = """#!/bin/bash
{cd}python3 -m unittest discover -s /tests -p 'test_*.py' && echo 1 > /logs/verifier/reward.txt \\
  || echo 0 > /logs/verifier/reward.txt
"""
SHADOW_CHECK = """import unittest


class Answer(unittest.TestCase):
    def test_the_answer_file_holds_42(self):
        with open("/app/answer.txt") as f:
            self.assertEqual(f.read().strip(), "42")
"""


# SHADOWS (skyrl_harbor_terminal.probes): modules in /app that python -m would run in place of the real ones.
@pytest.mark.filterwarnings("ignore::skyrl_harbor_terminal.task.HarborTaskWarning")  # the lint flags it: test_lint
@pytest.mark.parametrize("cd", ["", "cd /app\n"], ids=["from-the-verifiers-cwd", "after-cd-workdir"])
def test_modules_left_in_the_workdir_do_not_run_in_place_of_a_python_m_test(machine_backend: str, tmp_path: Path,
                                                                             cd: str):
    row = write_task(tmp_path / "shadow", {"tests/test.sh": SHADOW_TEST.format(cd=cd),
                                           "tests/test_outputs.py": SHADOW_CHECK})
    results, _ = play(row, [bash(SHADOWS), "<done/>"], backend=machine_backend)
    reward, info = scored(results)
    assert reward == 0.0, f"a module in /app ran in place of the test: {info.get('verifier_output_tail')}"
    results, _ = play(row, [bash(SHADOWS), bash("echo 42 > /app/answer.txt", done=True)], backend=machine_backend)
    assert scored(results)[0] == 1.0, "the real test must still run and pass"


def test_the_tests_can_ask_to_start_in_the_workdir(machine_backend: str, tmp_path: Path):
    row = write_task(tmp_path / "cwd", {"tests/test.sh": "#!/bin/bash\npwd > /logs/verifier/where\n"
                                        "[ \"$(pwd)\" = /app ] && echo 1 > /logs/verifier/reward.txt\n"})
    assert scored(play(row, ["<done/>"], backend=machine_backend)[0])[0] == 0.0
    results, _ = play(row, [bash("true"), "<done/>"], backend=machine_backend, verifier_cwd="workdir")
    assert scored(results)[0] == 1.0


def test_starting_the_tests_in_the_workdir_lints_them_as_started_there(tmp_path: Path):
    from skyrl_harbor_terminal.env import HarborTerminalEnv

    write_task(tmp_path / "pytest-here", {"tests/test.sh": "#!/bin/bash\npython3 -m pytest /tests/test_x.py\n"})
    config = HarborTerminalEnv.config_class(tasks=str(tmp_path), verifier_cwd="workdir")
    with pytest.warns(UserWarning, match=r"tests/test.sh:2: runs-in-workdir: .*env.verifier_cwd=workdir"):
        HarborTerminalEnv.load_dataset(config=config)


# --- 3. no escape through an env error -------------------------------------------------------------------------

@pytest.mark.slow  # up to ~20 s a case
@pytest.mark.parametrize("escape", list(ESCAPES))
def test_an_agent_cannot_turn_its_episode_into_an_env_error(machine_backend: str, escape: str):
    row = builtin_row("hello-world-file")
    replies = [bash(ESCAPES[escape]), bash("echo still-here"), "<done/>"]
    # 8 s: under the 20 s sleep of the stat-fields trick, and room for a loaded machine's shell restart.
    results, env = play(row, replies, backend=machine_backend, command_timeout_s=8)
    assert "still-here" in said(results[1]), said(results[1])  # the next command found a working shell
    reward, info = scored(results)
    assert reward == 0.0 and env.get_metrics()["agent_failures"] == 0
    results, _ = play(row, [bash(ESCAPES[escape]), bash("chmod 755 /app", HELLO, done=True)],
                      backend=machine_backend, command_timeout_s=8)
    assert scored(results)[0] == 1.0, "the honest work after the trick is still verified"


TOML = """schema_version = "1.1"
{head}[task]
name = "test/{name}"
[metadata.skyrl]
base_packages_only = true
[verifier]
timeout_sec = 20.0
[agent]
timeout_sec = 60.0
{agent}[environment]
memory_mb = 512
workdir = "/app"
{steps}"""
ROOT_AGENT_TOML = TOML.format(head="", name="root-agent", agent='user = "root"\n', steps="")


def test_a_root_agent_that_stops_its_machine_scores_0_as_its_own_failure(machine_backend: str, tmp_path: Path):
    """On docker, `kill -9 -1` as root ends the container's main process and so the container: nothing can run
    afterwards, not even the tests. That is the agent's failure, scored 0 with the reason, not an env error."""
    row = write_task(tmp_path / "root", {"tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"},
                     toml=ROOT_AGENT_TOML)
    results, env = play(row, [bash("kill -9 -1; sleep 2; echo after"), bash("echo more"), "<done/>"],
                        backend=machine_backend)
    reward, info = scored(results)
    if runs_images(machine_backend):
        assert reward == 0.0 and env.get_metrics()["agent_failures"] == 1
        assert "agent_failure" in info and "could not run" in info["reward_problem"]
    else:  # the agent's PID namespace holds only its own processes: its machine goes on, the tests run
        assert reward == 1.0 and "agent_failure" not in info


# --- 4. nothing is left behind ---------------------------------------------------------------------------------

# Folders the agent owns but made unwritable or unsearchable, a tree nested deeper than Python's rmtree recurses
# (it raises RecursionError), a FIFO and a link to / in the folders the host removes.
UNDELETABLE = """mkdir -p /app/trap/a/b ~/trap /tmp/trap/x && touch /app/trap/a/b/f ~/trap/f /tmp/trap/x/f
python3 -c "import os; os.makedirs('/app/deep'); os.chdir('/app/deep')
for _ in range(3000): os.mkdir('d'); os.chdir('d')
open('f', 'w').close(); os.chmod('.', 0o500)"
chmod 000 /app/trap/a/b /tmp/trap/x; chmod 500 /app/trap/a /app/trap ~/trap /tmp/trap /app/deep
mkfifo /logs/agent/fifo; ln -s / /app/root-link; echo planted"""


def test_an_image_volume_is_removed_with_its_episode(docker_backend: str, tmp_path: Path):
    from skyrl_sandbox.backends.docker.client import DOCKER

    row = write_task(tmp_path / "volume", {
        "environment/Dockerfile": f"FROM {TERMINAL_IMAGE}\nWORKDIR /app\nVOLUME /data\n",
        "tests/test.sh": "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"}, base_only=False)
    api = DOCKER.shared_client().api
    before = {volume["Name"] for volume in api.volumes().get("Volumes") or []}
    for _ in range(2):
        results, _ = play(row, [bash("echo secret > /data/kept && ls /data"), "<done/>"], backend=docker_backend)
        assert "kept" in said(results[0])
        scored(results)
    left = {volume["Name"] for volume in api.volumes().get("Volumes") or []} - before
    assert left == set(), f"anonymous volumes outlived their episodes: {left}"


def leftovers(owner: int) -> dict[str, list[str]]:
    """What the sandboxes of process ``owner`` (this one) still hold: containers, cgroups, machine folders."""
    from skyrl_sandbox import dirs
    from skyrl_sandbox.cgroups import cgroup_support

    found: dict[str, list[str]] = {"containers": [], "volumes": [], "cgroups": [], "folders": []}
    if os.environ.get("SKYRL_REQUIRE_DOCKER") == "1" or _docker_answers():
        from skyrl_sandbox.backends.docker.client import DOCKER
        from skyrl_sandbox.backends.docker.worker import OWNER_LABEL

        api = DOCKER.shared_client().api
        found["containers"] = [c["Id"][:12]
                               for c in api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})]
        found["volumes"] = [volume["Name"] for volume in api.volumes().get("Volumes") or []]
    support = cgroup_support()
    if support is not None:
        parents = {support.pids.parent, support.memory.parent, *([support.freezer.parent] if support.freezer else [])}
        found["cgroups"] = [str(group) for parent in parents for group in parent.glob(f"skyrl-sandbox-{owner}-*")]
    found["folders"] = [str(path) for path in dirs.process_dir().iterdir()]
    return found


def _docker_answers() -> bool:
    from skyrl_sandbox.backends.docker.client import DOCKER

    return DOCKER.problem() is None


def test_after_hostile_episodes_no_container_volume_cgroup_or_folder_remains(machine_backend: str):
    from skyrl_sandbox import dirs

    dirs.process_dir()
    row = builtin_row("hello-world-file")
    attacks = [bash(UNDELETABLE), bash(SURVIVOR), bash(ESCAPES["a FIFO where the shell reads its history"]),
               bash("for i in 1 2 3; do setsid sleep 600 & done; nohup sleep 700 >/dev/null 2>&1 & echo ok")]
    before = leftovers(os.getpid())  # other tests' live sandboxes (warm worker pools) of this process stay
    for attack in attacks:
        results, _ = play(row, [attack, "<done/>"], backend=machine_backend, command_timeout_s=5)
        assert scored(results)[0] == 0.0
    after = leftovers(os.getpid())
    assert {kind: sorted(set(after[kind]) - set(before[kind])) for kind in after} == \
        {"containers": [], "volumes": [], "cgroups": [], "folders": []}


UNPRIVILEGED_TRAINER = """
import json, os, site, sys
site.addsitedir(sys.argv[3])  # this run's packages, under the system's Python (see the test)
sys.path.insert(0, sys.argv[1])
from harbor_helpers import bash, builtin_row, play
from skyrl_sandbox import dirs
row = builtin_row("hello-world-file")
rewards = []
for _ in range(3):
    results, env = play(row, [bash(sys.argv[2]), "<done/>"], backend="bwrap")
    rewards.append(sum(r.reward for r in results))
    assert "error" not in results[-1].info, results[-1].info
print(json.dumps({"uid": os.getuid(), "rewards": rewards, "left": [p.name for p in dirs.process_dir().iterdir()],
                  "process_dir": str(dirs.process_dir())}), flush=True)
"""


@pytest.fixture
def unprivileged_home():
    """A home folder (and TMPDIR) for the user nobody, outside pytest's root-only temporary folders."""
    if os.geteuid() != 0:
        pytest.skip("switching to an unprivileged user needs root (this run is unprivileged already)")
    home = Path(tempfile.mkdtemp(prefix="skyrl-unprivileged-"))
    os.chown(home, 65534, 65534)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_an_unprivileged_trainer_removes_what_the_agent_made_undeletable(bwrap_backend: str,
                                                                          unprivileged_home: Path):
    """As a trainer without root the agent's files are the trainer's own, made unwritable by the agent: close()
    gives the permissions back and removes them, and the process's folder goes at exit.

    The trainer runs the system's Python of this run's minor version with this run's site-packages: the
    interpreter of a root-owned virtual environment may live where no other user can reach it (/root/.pyenv).
    """
    system_python = shutil.which(f"python3.{sys.version_info.minor}", path="/usr/bin")
    if system_python is None:
        pytest.skip(f"no /usr/bin/python3.{sys.version_info.minor} for an unprivileged user to run")
    site_packages = next(p for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages"))
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", system_python, "-c", UNPRIVILEGED_TRAINER,
         str(Path(__file__).parent), UNDELETABLE, site_packages],
        env={"PATH": os.environ["PATH"], "HOME": str(unprivileged_home), "TMPDIR": str(unprivileged_home)},
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["uid"] == 65534 and report["rewards"] == [0.0, 0.0, 0.0]
    assert report["left"] == [], f"machine folders outlived close(): {report['left']}"
    assert not Path(report["process_dir"]).exists(), "the trainer's sandbox folder outlived it"
    assert "could not remove" not in done.stderr, done.stderr[-2000:]


# --- 5. multi-step setup on bwrap ------------------------------------------------------------------------------

MULTI_STEP_TOML = TOML.format(head='multi_step_reward_strategy = "mean"\n', name="two-steps", agent="",
                              steps='[[steps]]\nname = "first"\n[[steps]]\nname = "second"\n')


def test_a_step_setup_script_runs_on_every_backend(machine_backend: str, tmp_path: Path):
    check = "#!/bin/bash\n[ \"$(cat /app/{0}.txt 2>/dev/null)\" = {0} ] && echo 1 > /logs/verifier/reward.txt\n"
    row = write_task(tmp_path / "steps", {
        "steps/first/instruction.md": "Write first into /app/first.txt.\n",
        "steps/first/tests/test.sh": check.format("first"),
        "steps/second/instruction.md": "Copy /app/given.txt to /app/second.txt.\n",
        "steps/second/setup.sh": "#!/bin/bash\necho second > /app/given.txt\n",
        "steps/second/tests/test.sh": check.format("second")}, toml=MULTI_STEP_TOML)
    replies = [bash("echo first > /app/first.txt", done=True), bash("cp /app/given.txt /app/second.txt", done=True)]
    results, _ = play(row, replies, backend=machine_backend)
    reward, info = scored(results)
    assert info["step_rewards"] == [1.0, 1.0] and reward == 1.0
