"""Steps as Harbor runs them: a step's workdir/ upload, its setup and healthcheck, [environment] env, artifacts.

A two-step task of our own (``pipeline``) uses all of them; its oracle scores 1 and doing nothing
0, on docker and on bwrap. Then the edges: healthchecks that never pass (an env error before the
agent's first command, the agent's failure after it), artifacts cut at their cap, and an agent
that tries to turn the upload or the artifacts against the machine or the host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import bash, play, runs_images, write_task
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_harbor_terminal.task import Artifact, Healthcheck, TaskFormatError, load_task

PIPELINE_TOML = """\
schema_version = "1.1"
artifacts = ["/app/out"]
[task]
name = "test/pipeline"
[metadata.skyrl]
base_packages_only = true
[verifier]
timeout_sec = 20.0
env = { MODE = "verifier" }
[agent]
timeout_sec = 60.0
[environment]
build_timeout_sec = 60.0
memory_mb = 512
workdir = "/app"
env = { GREETING = "hello from the task", MODE = "task", LITERAL = "${HOME}" }
artifacts = [{ source = "/app/sum.txt", destination = "sums/sum.txt" }]
[[steps]]
name = "prepare"
healthcheck = { command = "[ \\"$GREETING\\" = 'hello from the task' ] && test -f /app/ready", interval_sec = 0.2 }
[[steps]]
name = "finish"
healthcheck = { command = "test -f /app/stage && test -f /app/more.txt", interval_sec = 0.2, retries = 1 }
artifacts = [{ source = "/app/total.txt", destination = "total" }]
"""
PREPARE_TEST = """\
#!/bin/bash
ok=1
[ "$(cat /app/sum.txt 2>/dev/null)" = 7 ] || ok=0
[ "$(cat /app/greeting.txt 2>/dev/null)" = "hello from the task" ] || ok=0      # the agent's shell saw it
[ "$(cat /app/setup-greeting 2>/dev/null)" = "hello from the task" ] || ok=0  # the setup saw it
[ "$GREETING" = "hello from the task" ] && [ "$MODE" = verifier ] || ok=0     # [verifier] env wins
[ -e /app/more.txt ] && ok=0  # the next step's files are not there yet
echo $ok > /logs/verifier/reward.txt
"""
FINISH_TEST = """\
#!/bin/bash
[ "$(cat /app/total.txt 2>/dev/null)" = 12 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
PIPELINE_FILES = {
    "steps/prepare/instruction.md": "Write the sum of the numbers in /app/data/input.txt to /app/sum.txt.\n",
    "steps/prepare/workdir/data/input.txt": "3\n4\n",
    "steps/prepare/workdir/bin/tool.sh": "#!/bin/sh\necho tool-ran\n",
    "steps/prepare/workdir/notes.sh": "#!/bin/sh\necho not executable in the task\n",
    "steps/prepare/setup.sh": "#!/bin/bash\ntouch /app/ready\necho \"$GREETING\" > /app/setup-greeting\n",
    "steps/prepare/tests/test.sh": PREPARE_TEST,
    "steps/prepare/solution/solve.sh": (
        "#!/bin/bash\nawk '{s += $1} END {print s}' /app/data/input.txt > /app/sum.txt\n"
        "echo \"$GREETING\" > /app/greeting.txt\n"),
    "steps/finish/instruction.md": "Add the number in /app/more.txt to /app/sum.txt's, into /app/total.txt.\n",
    "steps/finish/workdir/more.txt": "5\n",
    "steps/finish/setup.sh": "#!/bin/bash\necho stage2 > /app/stage\n",
    "steps/finish/tests/test.sh": FINISH_TEST,
    "steps/finish/solution/solve.sh": (
        "#!/bin/bash\necho $(( $(cat /app/sum.txt) + $(cat /app/more.txt) )) > /app/total.txt\n"
        "mkdir -p /app/out && cp /app/total.txt /app/out/copy.txt\n"),
}


def text(result: Any) -> str:
    return "\n".join(message["content"] for message in result.observation)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tasks") / "pipeline"
    row = write_task(root, PIPELINE_FILES, toml=PIPELINE_TOML)
    os.chmod(root / "steps/prepare/workdir/bin/tool.sh", 0o755)
    os.chmod(root / "steps/prepare/workdir/notes.sh", 0o644)
    return {**row, "steps": 2}


# -- reading the task ------------------------------------------------------------------------------------------------


def test_the_new_keys_are_read(pipeline: dict[str, Any]) -> None:
    task = load_task(pipeline["task_path"])
    assert task.warnings == ()
    assert task.environment.env == {"GREETING": "hello from the task", "MODE": "task", "LITERAL": "${HOME}"}
    # top-level and [environment] artifacts are the task's
    assert task.artifacts == (Artifact("/app/out", "app/out"), Artifact("/app/sum.txt", "sums/sum.txt"))
    prepare, finish = task.steps
    assert prepare.healthcheck == Healthcheck("[ \"$GREETING\" = 'hello from the task' ] && test -f /app/ready",
                                              interval_sec=0.2, timeout_sec=30.0, retries=3, start_period_sec=0.0)
    assert finish.healthcheck.retries == 1 and finish.artifacts == (Artifact("/app/total.txt", "total"),)
    assert prepare.workdir_dir == Path(pipeline["task_path"]) / "steps/prepare/workdir"
    files, modes, _ = task.workdir_files(prepare)
    assert sorted(files) == ["bin/tool.sh", "data/input.txt", "notes.sh"]
    assert modes["bin/tool.sh"] & 0o111 and not modes["notes.sh"] & 0o111


def test_a_setup_script_in_the_step_workdir_is_the_steps_setup_as_in_harbor(tmp_path: Path) -> None:
    """Harbor 0.25 keeps a step's setup at steps/<name>/workdir/setup.sh: run as the setup, and uploaded with the rest."""
    files = {**PIPELINE_FILES, "steps/finish/workdir/setup.sh": PIPELINE_FILES["steps/finish/setup.sh"]}
    del files["steps/finish/setup.sh"]
    task = load_task(write_task(tmp_path / "moved", files, toml=PIPELINE_TOML)["task_path"])
    prepare, finish = task.steps
    assert prepare.setup_script.name == "setup.sh" and prepare.setup_script.parent.name == "prepare"
    assert finish.setup_script == tmp_path / "moved/steps/finish/workdir/setup.sh"
    assert "setup.sh" in task.workdir_files(finish)[0]
    both = write_task(tmp_path / "both", {**files, "steps/finish/setup.sh": "#!/bin/bash\n"}, toml=PIPELINE_TOML)
    with pytest.raises(TaskFormatError, match=r"step 'finish' has two setup scripts.*keep one"):
        load_task(both["task_path"])


def _task(tmp_path: Path, environment: str = "", steps: str = "", top: str = "", files: dict[str, str] | None = None
          ) -> str:
    toml = f'{top}\n[environment]\n{environment}\n' + (steps or "")
    layout = {"steps/one/instruction.md": "One.\n", "steps/one/tests/test.sh": FINISH_TEST} if steps else \
        {"tests/test.sh": FINISH_TEST}
    return write_task(tmp_path, {**layout, **(files or {})}, toml=toml)["task_path"]


@pytest.mark.parametrize(("where", "line", "error"), [
    ("environment", "healthcheck = { interval_sec = 1 }", r"\[environment\] healthcheck needs a command"),
    ("environment", 'healthcheck = { command = "true", timeout_sec = 0 }', "timeout_sec must be above 0"),
    ("environment", 'healthcheck = { command = "true", retries = -1 }', "retries must be a whole number >= 0"),
    ("environment", 'healthcheck = { command = "true", retries = 1000 }', "retries must be at most 100"),
    ("environment", 'healthcheck = { command = "true", interval_sec = 1e9 }', "interval_sec must be a number of sec"),
    ("environment", 'healthcheck = "true"', "healthcheck must be a table"),
    ("environment", 'env = { "BAD-NAME" = "x" }', r"env.BAD-NAME is not a variable name"),
    ("environment", "env = { A = 1 }", "env.A must be a string"),
    ("environment", 'mcp_servers = "x"', r"mcp_servers must be a list of tables"),
    ("top", 'artifacts = "/app/out"', "artifacts must be a list of paths"),
    ("top", 'artifacts = ["app/out"]', r"artifacts\[0\] source must be an absolute path"),
    ("top", 'artifacts = ["/app/../etc"]', "without '..' parts"),
    ("top", 'artifacts = ["/"]', "not /"),
    ("top", 'artifacts = [{ source = "/app/x", destination = "../x" }]', "destination must be a relative path"),
    ("top", 'artifacts = [{ source = "/app/x", destination = "/x" }]', "destination must be a relative path"),
    ("top", "artifacts = [{ destination = \"x\" }]", "needs a source"),
    ("top", "artifacts = [1]", "must be a path or a {source, destination} table"),
    ("step", 'healthcheck = { command = "  " }', r"\[\[steps\]\] 'one' healthcheck needs a command"),
    ("step", 'artifacts = ["x"]', r"\[\[steps\]\] 'one' artifacts\[0\] source must be an absolute path"),
])
def test_bad_values_are_errors_naming_table_and_key(tmp_path: Path, where: str, line: str, error: str) -> None:
    path = _task(tmp_path, environment=line if where == "environment" else "", top=line if where == "top" else "",
                 steps=f'[[steps]]\nname = "one"\n{line}\n' if where == "step" else "")
    with pytest.raises(TaskFormatError, match=error):
        load_task(path)


def test_mcp_servers_are_read_with_a_warning_that_they_are_not_honoured(tmp_path: Path) -> None:
    path = _task(tmp_path, environment='[[environment.mcp_servers]]\nname = "tools"\ntransport = "sse"\n'
                                       'url = "http://tools:8000/sse"\n')
    task = load_task(path, quiet=True)
    assert task.environment.mcp_servers == ({"name": "tools", "transport": "sse", "url": "http://tools:8000/sse"},)
    (warning,) = task.warnings
    assert "mcp_servers (1) is read but not honoured" in warning and "unknown key" not in warning


def test_a_step_workdir_with_a_link_out_of_the_task_is_refused(tmp_path: Path) -> None:
    path = _task(tmp_path / "t", steps='[[steps]]\nname = "one"\n', files={"steps/one/workdir/ok.txt": "ok\n"})
    (Path(path) / "steps/one/workdir/secret").symlink_to("/etc/passwd")
    with pytest.raises(TaskFormatError, match="symlink points outside the task folder"):
        load_task(path)
    (Path(path) / "steps/one/workdir/secret").unlink()
    os.symlink(tmp_path, Path(path) / "steps/one/workdir/up")
    with pytest.raises(TaskFormatError, match="symlinked folders are not supported"):
        load_task(path)


# -- the pipeline on real machines ------------------------------------------------------------------------------------


def test_the_oracle_passes_both_steps(machine_backend: str, pipeline: dict[str, Any], tmp_path: Path) -> None:
    env = HarborTerminalEnv(task=pipeline, config={"backend": machine_backend, "artifacts_dir": str(tmp_path)})
    try:
        env.reset()
        first, second = (env.step(action) for action in env.gold_actions())
    finally:
        env.close()
    assert first.info["step_reward"] == 1.0, env.verdicts[0].output_tail
    assert second.terminated and second.reward == 1.0 and second.info["step_rewards"] == [1.0, 1.0]
    assert second.info["step_rewards_by_key"] == [{"reward": 1.0}, {"reward": 1.0}]
    artifacts = second.info["artifacts"]
    folder = Path(artifacts["folder"])
    assert folder.parent == tmp_path / "test_pipeline" and not artifacts["cut"]
    assert (folder / "prepare/sums/sum.txt").read_text() == "7\n"
    assert (folder / "finish/sums/sum.txt").read_text() == "7\n"
    assert (folder / "finish/total").read_text() == "12\n"
    assert (folder / "finish/app/out/copy.txt").read_text() == "12\n"
    assert not (folder / "prepare/app/out").exists()  # not there yet after step one
    assert any("/app/out: not collected, it does not exist" in p for p in artifacts["problems"])
    assert {(c["step"], c["source"]) for c in artifacts["collected"]} == {
        ("prepare", "/app/sum.txt"), ("finish", "/app/total.txt"), ("finish", "/app/out"), ("finish", "/app/sum.txt")}
    assert env.get_metrics()["artifact_bytes"] == float(artifacts["bytes"]) == 2 + 2 + 3 + 3


def test_doing_nothing_scores_zero(machine_backend: str, pipeline: dict[str, Any], tmp_path: Path) -> None:
    results, _ = play(pipeline, ["<done/>", "<done/>"], backend=machine_backend, artifacts_dir=str(tmp_path))
    assert results[-1].reward == 0.0 and results[-1].info["step_rewards"] == [0.0, 0.0]


def test_the_agent_sees_the_uploaded_files_its_own_with_their_modes_and_the_env(
        machine_backend: str, pipeline: dict[str, Any], tmp_path: Path) -> None:
    results, _ = play(pipeline, [bash(
        "stat -c '%U %a %n' data/input.txt bin/tool.sh notes.sh", "bin/tool.sh",
        'echo "[$GREETING] [$MODE] [$LITERAL]"'), "<done/>", "<done/>"], backend=machine_backend,
        artifacts_dir=str(tmp_path))
    seen = text(results[0])
    assert "agent 644 data/input.txt\nagent 755 bin/tool.sh\nagent 644 notes.sh" in seen
    assert "tool-ran" in seen
    assert "[hello from the task] [task] [${HOME}]" in seen  # verbatim, nothing expanded


# -- healthchecks -----------------------------------------------------------------------------------------------------

SIMPLE = ('schema_version = "1.1"\n[task]\nname = "test/health"\n[metadata.skyrl]\nbase_packages_only = true\n'
          '[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 60.0\n[environment]\nworkdir = "/app"\n')
PASS_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def test_a_task_healthcheck_that_never_passes_is_an_env_error(machine_backend: str, tmp_path: Path) -> None:
    row = write_task(tmp_path / "health", {"tests/test.sh": PASS_SH}, toml=SIMPLE + (
        'healthcheck = { command = "echo not ready >&2; false", interval_sec = 0.1, retries = 2 }\n'))
    results, env = play(row, [bash("echo hi"), bash("echo again")], backend=machine_backend)
    (result,) = results
    assert result.truncated and not result.terminated and result.reward == 0.0
    error = result.info["error"]
    assert "task test/health: the healthcheck" in error and "did not pass in 3 tries" in error
    assert "not ready" in error
    assert env.get_metrics()["container_errors"] == 1.0


def test_a_first_steps_healthcheck_failing_is_an_env_error_and_a_later_ones_the_agents(
        docker_backend: str, tmp_path: Path) -> None:
    toml = SIMPLE + ('[[steps]]\nname = "one"\nhealthcheck = { command = "test -f /app/keep", interval_sec = 0.1, '
                     'retries = 0 }\n[[steps]]\nname = "two"\n'
                     'healthcheck = { command = "test -f /app/keep", interval_sec = 0.1, retries = 1, '
                     'timeout_sec = 5 }\n')
    files = {"steps/one/instruction.md": "One.\n", "steps/one/tests/test.sh": PASS_SH,
             "steps/two/instruction.md": "Two.\n", "steps/two/tests/test.sh": PASS_SH}
    broken = write_task(tmp_path / "broken", files, toml=toml)
    results, _ = play(broken, [bash("true", done=True)], backend=docker_backend)
    assert "the healthcheck of step one" in results[-1].info["error"] and "did not pass in 1 tries" in \
        results[-1].info["error"]

    files["environment/Dockerfile"] = "FROM skyrl-terminal-base:bookworm-1\nWORKDIR /app\nRUN touch /app/keep\n"
    row = write_task(tmp_path / "later", files, toml=toml)
    results, env = play(row, [bash("rm -f /app/keep", done=True)], backend=docker_backend)
    last = results[-1]
    assert "error" not in last.info and last.truncated
    assert "the healthcheck of step two" in last.info["agent_failure"]
    assert last.info["step_rewards"] == [1.0, 0.0] and last.reward == 0.5
    assert env.get_metrics()["agent_failures"] == 1.0 and env.get_metrics()["container_errors"] == 0.0


def test_a_healthcheck_waits_out_its_start_period(machine_backend: str, tmp_path: Path) -> None:
    row = write_task(tmp_path / "slow", {"tests/test.sh": PASS_SH}, toml=SIMPLE + (
        'healthcheck = { command = "n=$(cat /tmp/n 2>/dev/null || echo 0); echo $((n + 1)) > /tmp/n; [ $n -ge 4 ]", '
        'interval_sec = 0.1, retries = 0, start_period_sec = 30 }\n'))
    results, _ = play(row, [bash("cat /tmp/n", done=True)], backend=machine_backend)
    assert "5\n" in text(results[0]) and results[0].reward == 1.0


# -- artifacts: the cap, and links the agent leaves ------------------------------------------------------------------

ARTIFACT_TOML = SIMPLE.replace("test/health", "test/artifacts") + (  # [environment] artifacts: the task's too
    'artifacts = ["/app/big", "/app/out", "/app/tree", "/app/via/passwd"]\n')


def test_artifacts_are_cut_at_their_cap(machine_backend: str, tmp_path: Path) -> None:
    row = write_task(tmp_path / "big", {"tests/test.sh": PASS_SH}, toml=ARTIFACT_TOML)
    results, _ = play(row, [bash("mkdir -p /app/big && head -c 600 /dev/zero > /app/big/a && "
                                 "head -c 600 /dev/zero > /app/big/b && mkdir /app/tree && echo t > /app/tree/small",
                                 done=True)],
                      backend=machine_backend, artifacts_dir=str(tmp_path / "out"), max_artifact_bytes=1000)
    artifacts = results[-1].info["artifacts"]
    assert artifacts["cut"] and artifacts["bytes"] <= 1000
    written = sorted(p.name for p in Path(artifacts["folder"]).rglob("*") if p.is_file())
    assert written in (["a", "small"], ["b", "small"])  # one 600-byte file and the 2-byte one fit
    assert any("/app/big: cut at the episode's 1000 artifact bytes" in p for p in artifacts["problems"])
    assert results[-1].reward == 1.0  # the cut changes nothing of the reward


def test_no_artifacts_are_collected_with_a_zero_cap(docker_backend: str, tmp_path: Path) -> None:
    row = write_task(tmp_path / "none", {"tests/test.sh": PASS_SH}, toml=ARTIFACT_TOML)
    results, _ = play(row, [bash("mkdir -p /app/big && echo x > /app/big/a", done=True)], backend=docker_backend,
                      artifacts_dir=str(tmp_path / "out"), max_artifact_bytes=0)
    artifacts = results[-1].info["artifacts"]
    assert artifacts["collected"] == [] and "not collected (env.max_artifact_bytes=0)" in artifacts["problems"][0]
    assert not (tmp_path / "out").exists()


def test_the_agent_cannot_point_an_artifact_elsewhere(machine_backend: str, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"  # a file of the host's (on bwrap, the machine's folders are on this host)
    secret.write_text("HOST-SECRET\n")
    row = write_task(tmp_path / "links", {"tests/test.sh": PASS_SH}, toml=ARTIFACT_TOML)
    out = tmp_path / "out"
    results, _ = play(row, [bash(
        f"ln -s /etc/shadow /app/out; ln -s {secret} /app/big",
        f"mkdir /app/tree && echo mine > /app/tree/mine.txt && ln -s /etc/shadow /app/tree/shadow && "
        f"ln -s {secret} /app/tree/host && ln -s /etc /app/tree/etc && ln /etc/passwd /app/tree/hard 2>/dev/null",
        "ln -s /etc /app/via", done=True)], backend=machine_backend, artifacts_dir=str(out))
    artifacts = results[-1].info["artifacts"]
    problems = "\n".join(artifacts["problems"])
    assert "/app/out: not collected, it is a symlink: not followed" in problems
    assert "/app/big: not collected, it is a symlink: not followed" in problems
    assert "/app/via/passwd: not collected, a folder on the way is a symlink" in problems
    assert "tree/shadow: a symlink, skipped" in problems and "tree/etc: a symlink, skipped" in problems
    files = {p.relative_to(artifacts["folder"]).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert files.pop("main/app/tree/mine.txt") == b"mine\n"
    for content in files.values():  # at most the hard link, which is the agent's own (readable) /etc/passwd
        assert b"HOST-SECRET" not in content and b"root:*" not in content and b"root:!" not in content
    assert not any(p.is_symlink() for p in out.rglob("*"))


# -- the upload cannot be turned against the tests ------------------------------------------------------------------

UPLOAD_TOML = SIMPLE.replace("test/health", "test/upload") + '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n'
STEP_TWO_TEST = ("#!/bin/bash\n[ -f /app/solved ] && echo 1 > /logs/verifier/reward.txt || "
                 "echo 0 > /logs/verifier/reward.txt\n")


def test_links_the_agent_leaves_do_not_send_the_next_steps_files_into_the_tests(machine_backend: str,
                                                                                 tmp_path: Path) -> None:
    row = write_task(tmp_path / "upload", {
        "steps/one/instruction.md": "One.\n", "steps/one/tests/test.sh": PASS_SH,
        "steps/two/instruction.md": "Two.\n", "steps/two/tests/test.sh": STEP_TWO_TEST,
        "steps/two/workdir/probe/test.sh": PASS_SH,  # would pass step two if it replaced the tests
        "steps/two/workdir/verifier/reward.txt": "1\n",
        "steps/two/workdir/bin/python3": "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n",
        "steps/two/workdir/notes.txt": "root::0:0::/root:/bin/sh\n",  # written through a link as root: a root login
    }, toml=UPLOAD_TOML)
    results, _ = play(row, [bash("mkdir -p /tests /logs/verifier 2>/dev/null; ln -s /tests /app/probe; "
                                 "ln -s /logs/verifier /app/verifier; ln -s /usr/local/bin /app/bin; "
                                 "ln -s /etc/passwd /app/notes.txt", done=True),
                            "<done/>"], backend=machine_backend)
    last = results[-1]
    assert last.info["step_rewards"][0] == 1.0 and last.info["step_rewards"][1] == 0.0 and last.reward == 0.5
    if runs_images(machine_backend):  # the copy runs as the agent: root's folders refuse it, scored as its failure
        assert "uploading step two's workdir/ into /app as agent failed" in last.info["agent_failure"]
        assert "cannot overwrite non-directory '/app/./probe'" in last.info["agent_failure"]
        assert "'/app/./notes.txt': Permission denied" in last.info["agent_failure"]
