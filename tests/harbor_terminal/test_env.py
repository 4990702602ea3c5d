"""The harbor_terminal env end to end on real machines: the shell, its limits, the verifier's reward, cleanup.

Episodes play scripted replies against the built-in hello-world-file task (create ``/app/hello.txt``
holding ``Hello, world!``) or small tasks written into tmp_path. Behaviour that both machine backends
must show runs on each (``machine_backend``); Docker-only behaviour (images, containers) on docker.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import bash, builtin_row, play, write_task
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_sandbox.backends.docker.client import DOCKER
from skyrl_sandbox.backends.docker.worker import owner_labels

SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"
RESTARTED = "[the shell exited or could not be interrupted and was started again"
OMITTED = "bytes of output omitted ...]"


@pytest.fixture(scope="module")
def hello() -> dict[str, Any]:
    return builtin_row("hello-world-file")


def text(result: Any) -> str:
    return "\n".join(message["content"] for message in result.observation)


def our_containers() -> list[dict[str, Any]]:
    """Sandbox containers of this test process (its pid and start time), running or not."""
    labels = [f"{key}={value}" for key, value in owner_labels().items()]
    return DOCKER.shared_client().api.containers(all=True, filters={"label": labels})


# -- the persistent shell ------------------------------------------------------------------------------


def test_shell_state_carries_over_between_turns(machine_backend: str, hello: dict[str, Any]) -> None:
    results, _ = play(hello, [
        bash("cd /tmp && mkdir -p work && cd work",
             'export GREETING=hi; greet() { echo "$GREETING $1"; }',
             "sleep 300 & echo started"),
        bash('pwd; greet bob; kill -0 "$!" && echo job-alive; jobs', "ls /no/such/file"),
        bash(f"cd /app && {SOLVE}", done=True),
    ], backend=machine_backend, max_turns=3)
    first, second, third = (text(r) for r in results)
    assert first.count("[exit status 0]") == 3
    assert first.startswith("$ cd /tmp && mkdir -p work && cd work\n[exit status 0]\n\n$ export GREETING=hi;")
    assert "started" in first
    # the directory, the exported variable, the function and the background job are all still there
    assert "/tmp/work\nhi bob\njob-alive\n" in second
    assert "Running" in second and "sleep 300 &" in second
    assert "$ ls /no/such/file\n" in second and "No such file or directory" in second
    assert second.rstrip().endswith("[exit status 2]")
    assert [r.reward for r in results] == [0.0, 0.0, 1.0]
    assert results[-1].terminated and not results[-1].truncated


def test_a_command_that_never_ends_is_interrupted_and_the_shell_goes_on(machine_backend: str,
                                                                        hello: dict[str, Any]) -> None:
    results, env = play(hello, [
        bash("export KEEP=kept; cd /tmp", "sleep 1000"),
        bash("trap '' INT; sleep 1000"),  # the shell and sleep both ignore Ctrl-C
        bash('echo "$KEEP in $(pwd)"', f"cd /app && {SOLVE}", done=True),
    ], backend=machine_backend, command_timeout_s=2, max_turns=3)
    # bash may report the killed job ("Killed", "[1]+  Killed  sleep 1000") around later output, as a terminal would
    first, second, third = ("\n".join(line for line in text(r).split("\n") if "Killed" not in line) for r in results)
    assert "$ sleep 1000\n[interrupted: the command ran longer than 2 s]" in first
    assert second.rstrip().endswith("[interrupted: the command ran longer than 2 s]")
    for observation in (first, second, third):
        assert RESTARTED not in observation
    assert "kept in /tmp\n[exit status 0]" in third
    assert results[-1].reward == 1.0
    metrics = env.get_metrics()
    assert metrics["command_timeouts"] == 2.0 and metrics["shell_restarts"] == 0.0 and metrics["commands"] == 5.0


def test_a_flood_of_output_comes_back_bounded(machine_backend: str, hello: dict[str, Any]) -> None:
    limit = 4096
    results, env = play(hello, [
        bash("yes | head -c 5000000"),  # 5 MB: over a thousand times the bound, and done well within 3 s
        bash("cat /dev/urandom | base64"),  # endless: the command time-out ends it
        bash("echo still here", done=True),
    ], backend=machine_backend, command_timeout_s=3, max_output_bytes=limit, max_turns=3)
    yes, urandom, last = (text(r) for r in results)
    assert f"[... {5_000_000 - limit:,} {OMITTED}" in yes  # exactly the head and the tail are kept
    assert yes.rstrip().endswith("y\n[exit status 0]")
    assert OMITTED in urandom and "[interrupted: the command ran longer than 3 s]" in urandom
    for observation in (yes, urandom):
        assert len(observation.encode()) < limit + 300
    assert "still here\n[exit status 0]" in last
    assert env.get_metrics()["truncated_outputs"] == 2.0


@pytest.mark.parametrize("killer", ["exit", "kill -9 $$"])
def test_a_shell_that_exits_or_is_killed_is_started_again(machine_backend: str, hello: dict[str, Any],
                                                           killer: str) -> None:
    results, env = play(hello, [
        bash("export GONE=1; cd /tmp", killer),
        bash('echo "[${GONE:-unset}] $(pwd)"', SOLVE, done=True),
    ], backend=machine_backend, max_turns=2)
    first, second = text(results[0]), text(results[1])
    assert RESTARTED in first
    assert "[unset] /app\n[exit status 0]" in second  # a fresh shell in the work directory
    assert results[-1].reward == 1.0
    assert env.get_metrics()["shell_restarts"] == 1.0


# -- ends of an episode --------------------------------------------------------------------------------


def test_the_turn_limit_still_runs_the_tests(docker_backend: str, hello: dict[str, Any]) -> None:
    results, _ = play(hello, [bash(SOLVE), bash("echo not done yet")], backend=docker_backend, max_turns=2)
    assert len(results) == 2
    assert results[0].reward == 0.0 and not (results[0].terminated or results[0].truncated)
    last = results[1]
    assert last.truncated and not last.terminated
    assert last.reward == 1.0 and last.info["end_reason"] == "turn_limit" and last.info["step_rewards"] == [1.0]
    assert "not done yet" in text(last)


def test_an_empty_reply_on_the_last_turn_is_still_verified(docker_backend: str, hello: dict[str, Any]) -> None:
    results, _ = play(hello, [bash(SOLVE), "   "], backend=docker_backend, max_turns=2)
    last = results[-1]
    assert last.truncated and last.reward == 1.0 and last.info["end_reason"] == "turn_limit"
    assert "empty" in text(last)


def test_the_agents_time_running_out_ends_the_step_and_runs_the_tests(docker_backend: str,
                                                                         hello: dict[str, Any]) -> None:
    results, env = play(hello, [bash(SOLVE, "sleep 100", "echo never")], backend=docker_backend,
                        agent_timeout_s=2, max_turns=4)
    assert len(results) == 1
    result = results[0]
    assert result.truncated and not result.terminated
    assert result.info["end_reason"] == "agent_timeout" and result.reward == 1.0  # the work done still counts
    observation = text(result)
    assert "$ sleep 100\n[interrupted: the agent's time for this task (2 s) ran out]" in observation
    assert "echo never" not in observation and "remaining commands were not run" in observation
    assert env.get_metrics()["command_timeouts"] == 1.0


def test_a_reply_without_commands_and_one_with_too_many(machine_backend: str, hello: dict[str, Any]) -> None:
    results, env = play(hello, [
        "I will now create the file.",
        bash("echo one", "echo two", "echo three") + "\n```python\nprint('not run')\n```",
        "<done/>",
    ], backend=machine_backend, max_commands_per_turn=2, max_turns=3)
    assert text(results[0]).startswith("No commands found.") and results[0].reward == 0.0
    second = text(results[1])
    assert "one\n[exit status 0]" in second and "two\n[exit status 0]" in second and "three" not in second
    assert "[only the first 2 command blocks ran]" in second
    assert "[1 code block(s) in another language were not run; use ```bash]" in second
    assert results[-1].terminated and results[-1].reward == 0.0
    metrics = env.get_metrics()
    assert metrics["no_command_turns"] == 2.0 and metrics["refused_blocks"] == 1.0 and metrics["commands"] == 2.0


# -- the reward the tests write ------------------------------------------------------------------------

# The agent writes /app/case; the task's test.sh writes a reward file accordingly.
REWARD_TEST_SH = """\
#!/bin/bash
case "$(cat /app/case)" in
  half) echo '{"reward": 0.5, "tests": 2}' > /logs/verifier/reward.json ;;
  single) echo '{"score": 0.25}' > /logs/verifier/reward.json ;;
  garbage-json) echo '{"reward": ' > /logs/verifier/reward.json ;;
  garbage-txt) echo 'passed!' > /logs/verifier/reward.txt ;;
  seven) echo 7 > /logs/verifier/reward.txt ;;
  nothing) echo 'forgot the reward' ;;
  hang) echo 1 > /logs/verifier/reward.txt; sleep 100 ;;
esac
"""
REWARD_CASES = [
    ("half", 0.5, "reward.json", None),
    ("single", 0.25, "reward.json", None),
    ("garbage-json", 0.0, None, "reward.json is not JSON"),
    ("garbage-txt", 0.0, None, "reward.txt does not hold a number: 'passed!'"),
    ("seven", 1.0, "reward.txt", "reward.txt holds 7, clipped to [0, 1]"),
    ("nothing", 0.0, None, "the tests wrote no /logs/verifier/reward.txt or reward.json"),
    ("hang", 0.0, None, "the tests ran past their timeout (2 s) and were killed"),
]


@pytest.fixture(scope="module")
def reward_task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_task(tmp_path_factory.mktemp("tasks") / "reward-files", {"tests/test.sh": REWARD_TEST_SH})


@pytest.mark.parametrize(("case", "reward", "source", "problem"), REWARD_CASES, ids=[c[0] for c in REWARD_CASES])
def test_the_reward_file_the_tests_write(machine_backend: str, reward_task: dict[str, Any], case: str, reward: float,
                                         source: str | None, problem: str | None) -> None:
    results, env = play(reward_task, [bash(f"echo {case} > /app/case", done=True)], backend=machine_backend,
                        verifier_timeout_s=2)
    info = results[-1].info
    assert "error" not in info
    assert results[-1].reward == reward and info["step_rewards"] == [reward]
    assert info.get("reward_source") == source
    if problem is None:
        assert "reward_problem" not in info
    else:
        assert problem in info["reward_problem"]
    metrics = env.get_metrics()
    assert metrics["verifier_timeouts"] == float(case == "hang")
    assert metrics["reward_file_missing"] == float(source is None)


def test_nothing_the_agent_writes_to_the_reward_folder_counts(machine_backend: str, hello: dict[str, Any]) -> None:
    results, _ = play(hello, [bash("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                                   "(sleep 1; while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.1; done) &",
                                   done=True)], backend=machine_backend)
    assert results[-1].reward == 0.0 and results[-1].info["reward_source"] == "reward.txt"


# -- machines are always removed -----------------------------------------------------------------------

TWO_STEP_TOML = """\
schema_version = "1.1"
[task]
name = "test/two-steps"
[verifier]
timeout_sec = 20.0
[agent]
timeout_sec = 60.0
[environment]
workdir = "/app"
[[steps]]
name = "one"
[[steps]]
name = "two"
"""
PASS_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def test_containers_are_removed_whatever_ends_the_episode(docker_backend: str, hello: dict[str, Any],
                                                          tmp_path: Path) -> None:
    assert our_containers() == []
    broken_setup = write_task(tmp_path / "two-steps", {
        "steps/one/instruction.md": "One.\n", "steps/one/tests/test.sh": PASS_SH,
        "steps/two/instruction.md": "Two.\n", "steps/two/tests/test.sh": PASS_SH,
        "steps/two/setup.sh": "#!/bin/bash\necho 'setup broke' >&2\nexit 3\n"}, toml=TWO_STEP_TOML, base_only=False)
    episodes = [
        (hello, [bash(SOLVE, done=True)], {}),  # solved
        (hello, [bash("sleep 100")], {"agent_timeout_s": 1}),  # out of time
        (hello, [bash("kill -9 $$"), bash("exit")], {"max_turns": 2}),  # turn limit, shell gone
        (hello, [bash("sleep 1000 &", "yes > /dev/null &", done=True)], {"verifier_timeout_s": 1}),
        (broken_setup, [bash("true", done=True)], {}),  # the machine breaks between steps: scored, as the agent
        # could have broken what the setup needs
    ]
    ends = []
    for row, replies, config in episodes:
        results, _ = play(row, replies, backend=docker_backend, **config)
        info = results[-1].info
        ends.append(info.get("agent_failure") or info.get("end_reason") or info.get("error"))
        assert our_containers() == [], f"a container outlived the episode that ended with {ends[-1]!r}"
    assert ends[:3] == ["done", "agent_timeout", "turn_limit"]
    assert "setup of step two failed (exit 3)" in ends[4] and "setup broke" in ends[4]


def test_a_container_is_removed_when_a_later_steps_setup_fails_even_before_close(
        docker_backend: str, tmp_path: Path) -> None:
    """After the agent's commands, a failing setup is scored (the agent may have broken what it needs), not dropped."""
    row = write_task(tmp_path / "two-steps", {
        "steps/one/instruction.md": "One.\n", "steps/one/tests/test.sh": PASS_SH,
        "steps/two/instruction.md": "Two.\n", "steps/two/tests/test.sh": PASS_SH,
        "steps/two/setup.sh": "#!/bin/bash\nexit 3\n"}, toml=TWO_STEP_TOML, base_only=False)
    env = HarborTerminalEnv(task=row, config={"backend": docker_backend})
    try:
        env.reset()
        result = env.step(bash("true", done=True))
        assert result.truncated and "error" not in result.info
        assert "setup of step two failed" in result.info["agent_failure"] and result.info["step_rewards"] == [1.0, 0.0]
        assert our_containers() == []
        assert env.get_metrics()["container_errors"] == 0.0 and env.get_metrics()["agent_failures"] == 1.0
    finally:
        env.close()


def test_close_mid_episode_removes_the_container(docker_backend: str, hello: dict[str, Any]) -> None:
    env = HarborTerminalEnv(task=hello, config={"backend": docker_backend})
    env.reset()
    result = env.step(bash("sleep 600 &", "echo working"))
    assert not (result.terminated or result.truncated)
    assert len(our_containers()) == 1
    env.close()
    assert our_containers() == []
    env.close()  # twice is fine


# -- task environments that cannot be built ------------------------------------------------------------


def test_a_dockerfile_from_a_missing_image_ends_the_episode_with_an_error(docker_backend: str,
                                                                          tmp_path: Path) -> None:
    row = write_task(tmp_path / "missing-base", {
        "environment/Dockerfile": "FROM skyrl-test-no-such-image:42\nWORKDIR /app\n",
        "tests/test.sh": PASS_SH}, base_only=False)
    results, env = play(row, [bash("echo hi"), bash("echo again")], backend=docker_backend,
                        build_logs=str(tmp_path / "logs"))
    assert len(results) == 1
    result = results[0]
    assert result.truncated and not result.terminated and result.reward == 0.0
    assert "test/missing-base" in result.info["error"] and "skyrl-test-no-such-image:42" in result.info["error"]
    assert env.get_metrics()["container_errors"] == 1.0


def test_a_failing_run_step_names_the_task_and_its_build_log(docker_backend: str, tmp_path: Path) -> None:
    row = write_task(tmp_path / "bad-build", {
        "environment/Dockerfile": "FROM skyrl-terminal-base:bookworm-1\nRUN echo building-now && false\n",
        "tests/test.sh": PASS_SH}, base_only=False)
    logs = tmp_path / "logs"
    results, _ = play(row, [bash("echo hi")], backend=docker_backend, build_logs=str(logs))
    error = results[-1].info["error"]
    assert results[-1].truncated and "task test/bad-build: its image did not build" in error
    log_path = error.rsplit("build log: ", 1)[1].strip()
    assert Path(log_path).parent == logs and Path(log_path).is_file()
    assert "building-now" in Path(log_path).read_text()
    assert our_containers() == []


# -- pickling and metrics ------------------------------------------------------------------------------


def test_pickling_mid_episode_carries_no_machine(docker_backend: str, hello: dict[str, Any]) -> None:
    env = HarborTerminalEnv(task=hello, config={"backend": docker_backend, "max_turns": 3})
    try:
        env.reset()
        env.step(bash("echo warm"))
        [container] = our_containers()
        data = pickle.dumps(env)
        assert container["Id"].encode() not in data and container["Id"][:12].encode() not in data
        copy = pickle.loads(data)
        assert copy._machine is None and copy._shell is None and copy._provisioner is None
        assert copy.task == env.task and copy.config == env.config and copy.turn == 1
        # the original episode is unaffected
        assert env.step(bash(SOLVE, done=True)).reward == 1.0
    finally:
        env.close()
    copy.close()
    assert our_containers() == []


def test_metrics_describe_what_happened(docker_backend: str, hello: dict[str, Any]) -> None:
    results, env = play(hello, [
        bash("echo hi", "sleep 50"),
        "no commands here",
        bash("seq 1 100000", SOLVE, "exit", done=True),
    ], backend=docker_backend, command_timeout_s=1.5, max_output_bytes=1024, max_turns=3)
    assert results[-1].reward == 1.0
    metrics = env.get_metrics()
    expected = {"passed": 1.0, "commands": 5.0, "command_timeouts": 1.0, "shell_restarts": 1.0,
                "truncated_outputs": 1.0, "no_command_turns": 1.0, "refused_blocks": 0.0, "steps_verified": 1.0,
                "container_errors": 0.0, "verifier_timeouts": 0.0, "reward_file_missing": 0.0}
    assert {key: metrics[key] for key in expected} == expected
    for key in ("build_s", "start_s", "wait_s", "verify_s", "agent_command_s"):
        assert isinstance(metrics[key], float) and metrics[key] >= 0.0
    assert metrics["verify_s"] > 0.0 and metrics["agent_command_s"] >= 1.5  # the sleep ran until interrupted
    assert all(isinstance(value, float) for value in metrics.values())
