"""`skyrl harbor export`: Harbor-ready copies that load back here as the same task, and clear refusals.

Harbor's own loader and lint on the copies: test_harbor_tooling.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from harbor_helpers import write_task
from skyrl_harbor_terminal.cli import build_app
from skyrl_harbor_terminal.env import BUILTIN_TASKS, HarborTerminalEnv
from skyrl_harbor_terminal.harbor_export import ExportError, export_task
from skyrl_harbor_terminal.images import TERMINAL_IMAGE
from skyrl_harbor_terminal.task import load_task
from skyrl_harbor_terminal.task_model import HarborTask
from skyrl_harbor_terminal.toml_text import dumps
from typer.testing import CliRunner

TASKS = sorted(path.name for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())


def semantics(task: HarborTask) -> dict:
    """What a run of ``task`` depends on here, with our defaults applied (agent "agent", tests as root)."""
    env = task.environment
    return {
        "name": task.name, "multi_step": task.multi_step, "reward_strategy": task.reward_strategy,
        "workdir": env.workdir, "cpus": env.cpus, "memory_mb": env.memory_mb, "storage_mb": env.storage_mb,
        "allow_internet": env.allow_internet, "tests_run_agent_code": env.tests_run_agent_code,
        "reward_weights": task.reward_weights, "solution_env": task.solution_env,
        "steps": [{"name": step.name, "instruction": step.instruction, "tests": task.test_files(step),
                   "solution": task.solution_files(step), "agent_user": step.agent_user or "agent",
                   "verifier_user": step.verifier_user or "root", "agent_timeout": step.agent_timeout_sec,
                   "verifier_timeout": step.verifier_timeout_sec, "verifier_env": step.verifier_env,
                   "min_reward": step.min_reward, "contributes": step.contributes_to_reward}
                  for step in task.steps],
    }


@pytest.mark.parametrize("name", TASKS)
def test_a_builtin_task_exports_to_a_self_contained_copy_with_the_same_semantics(name: str, tmp_path: Path) -> None:
    out = export_task(BUILTIN_TASKS / name, tmp_path / name)
    copy = load_task(out, quiet=True)
    assert semantics(copy) == semantics(load_task(BUILTIN_TASKS / name, quiet=True))
    assert copy.test_helpers == () and not [w for w in copy.warnings if "unknown key" in w], copy.warnings
    data = tomllib.loads((out / "task.toml").read_text())
    assert data["agent"]["user"] == "agent" and data["environment"]["network_mode"] == "no-network"
    assert "allow_internet" not in data["environment"]
    dockerfile = (out / "environment/Dockerfile").read_text()
    assert f"FROM {TERMINAL_IMAGE}" not in dockerfile and dockerfile.startswith("FROM debian:bookworm-slim\n")
    assert "useradd -m -u 1000 -s /bin/bash agent" in dockerfile and "chown -R agent: /app" in dockerfile


def test_a_users_task_keeps_its_network_and_agent_user_and_its_own_helper_copy(tmp_path: Path) -> None:
    toml = ('schema_version = "1.1"\n[task]\nname = "user/online"\n[metadata.skyrl]\ntest_helpers = ["verifier.sh"]\n'
            '[agent]\nuser = "builder"\n[environment]\nallow_internet = true\nworkdir = "/srv"\n')
    own_helper = ". /dev/null\n"
    write_task(tmp_path / "online", {"tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
                                     "tests/verifier.sh": own_helper}, toml=toml)
    out = export_task(tmp_path / "online", tmp_path / "out" / "online")
    data = tomllib.loads((out / "task.toml").read_text())
    assert data["environment"] == {"workdir": "/srv", "network_mode": "public"}
    assert data["agent"] == {"user": "builder"} and "metadata" not in data
    assert (out / "tests/verifier.sh").read_text() == own_helper
    assert "chown -R builder: /srv" in (out / "environment/Dockerfile").read_text()
    assert load_task(out, quiet=True).environment.allow_internet is True


def test_a_steps_setup_moves_to_where_harbor_runs_it_from(tmp_path: Path) -> None:
    toml = ('[environment]\nworkdir = "/app"\n[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n')
    step = {"instruction.md": "Do it.\n", "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}
    files = {f"steps/{name}/{path}": text for name in ("one", "two") for path, text in step.items()}
    write_task(tmp_path / "staged", {**files, "steps/two/setup.sh": "echo ready > /app/ready\n"}, toml=toml)
    out = export_task(tmp_path / "staged", tmp_path / "out")
    assert not (out / "steps/two/setup.sh").exists()
    moved = load_task(out, quiet=True).steps[1].setup_script
    assert moved == out / "steps/two/workdir/setup.sh" and moved.read_text() == "echo ready > /app/ready\n"


@pytest.mark.parametrize("toml, dockerfile, expected", [
    ('[environment]\ndocker_image = "skyrl-terminal-base:bookworm-1"\nworkdir = "/app"\n', None,
     "docker_image = 'skyrl-terminal-base:bookworm-1' is built only by skyrl"),
    ("[environment]\n", f"FROM {TERMINAL_IMAGE}\n", "[environment] workdir is not stated"),
    ('[environment]\nworkdir = "/app"\n', f"ARG B={TERMINAL_IMAGE}\nFROM $B\n",
     "names skyrl-terminal-base:bookworm-1, which only skyrl builds"),
])
def test_what_harbor_cannot_have_is_refused_by_name(tmp_path: Path, toml: str, dockerfile: str | None,
                                                    expected: str) -> None:
    write_task(tmp_path / "t", {"tests/test.sh": "exit 0\n", "environment/Dockerfile": dockerfile or ""},
               toml='schema_version = "1.1"\n' + toml)
    if dockerfile is None:
        (tmp_path / "t/environment/Dockerfile").unlink()
    with pytest.raises(ExportError) as refused:
        export_task(tmp_path / "t", tmp_path / "out")
    assert expected in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_the_command_exports_what_it_can_and_names_what_it_cannot(tmp_path: Path) -> None:
    write_task(tmp_path / "tasks/good", {"tests/test.sh": "exit 0\n"})
    write_task(tmp_path / "tasks/bad", {"tests/test.sh": "exit 0\n"}, toml='schema_version = "1.1"\n')
    result = CliRunner().invoke(build_app(), ["export", str(tmp_path / "tasks"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert (tmp_path / "out/good/task.toml").is_file() and not (tmp_path / "out/bad").exists()
    assert "bad: not exported" in result.output and "workdir is not stated" in result.output
    again = CliRunner().invoke(build_app(), ["export", str(tmp_path / "tasks/good"), "--out", str(tmp_path / "out")])
    assert again.exit_code == 1 and "already exists" in again.output


@pytest.mark.parametrize("name", TASKS)
def test_toml_text_reads_back_equal(name: str) -> None:
    data = tomllib.loads((BUILTIN_TASKS / name / "task.toml").read_text())
    data["odd keys"] = {"a.b": "quote \" backslash \\ tab \t del \x7f", "n": [1.5, float("inf"), -0.0],
                        "inline": [{"x": 1}, "y"], "empty": {}}
    assert tomllib.loads(dumps(data)) == data


@pytest.mark.slow
def test_an_exported_task_still_runs_here(docker_backend: str, tmp_path: Path) -> None:
    """The copy's Dockerfile (public Debian + apt-get + its agent user) builds here and its oracle scores 1.

    Its apt-get needs the build network (scripts/setup.sh turns it on) and the offline debian: stand-in."""
    out = export_task(BUILTIN_TASKS / "git-find-commit", tmp_path / "git-find-commit")
    row = {"task_path": str(out), "name": "skyrl/git-find-commit", "steps": 1}
    env = HarborTerminalEnv(task=row, config={"backend": docker_backend})
    try:
        env.reset(options={"task": row})
        rewards = [env.step(action).reward for action in env.gold_actions()]
    finally:
        env.close()
    assert sum(rewards) == 1.0, [(v.reward, v.problem, v.output_tail[-500:]) for v in env.verdicts]
