"""Reading Harbor task folders: schemas 1.0 and 1.1, multi-step tasks, warnings and errors."""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
from skyrl_harbor_terminal.task import HarborTaskWarning, TaskFormatError, combine_rewards, load_task
from task_fixtures import MINIMAL_TOML, SOLVE_SH, TEST_SH, write_files, write_task

SCHEMA_1_1 = """\
schema_version = "1.1"

[task]
name = "acme/hello-file"
description = "Write a greeting."
authors = [{ name = "Ada", email = "ada@example.org" }, { name = "Grace" }]
keywords = ["files", "shell"]

[metadata]
difficulty = "easy"
anything = { goes = [1, 2] }

[verifier]
timeout_sec = 90
env = { EXPECTED = "hello" }
user = "root"

[agent]
timeout_sec = 200
user = "agent"

[solution]
env = { MODE = "oracle" }

[environment]
build_timeout_sec = 900
cpus = 2
memory_mb = 4096
storage_mb = 20480
allow_internet = true
workdir = "/app"
os = "linux"
"""

MULTI_STEP = """\
schema_version = "1.1"
multi_step_reward_strategy = "final"

[verifier]
timeout_sec = 100
env = { LEVEL = "task", SHARED = "yes" }

[agent]
timeout_sec = 50

[[steps]]
name = "setup-repo"
min_reward = 1.0

[[steps]]
name = "fix-bug"
contributes_to_reward = false
[steps.agent]
timeout_sec = 70
user = "dev"
[steps.verifier]
env = { LEVEL = "step" }
user = "checker"
"""


def load_quietly(task_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_task(task_dir)


def test_minimal_1_0_task_loads_with_our_defaults(tmp_path: Path) -> None:
    task = load_quietly(write_task(tmp_path))
    assert task.name == "hello-file"
    assert task.schema_version == "1.0"
    assert task.multi_step is False and task.reward_strategy == "mean"
    assert task.metadata == {"author_name": "Ada", "difficulty": "easy", "tags": ["files"]}
    assert task.warnings == ()
    env = task.environment
    assert env.context_dir == tmp_path / "hello-file" / "environment" and env.dockerfile == "Dockerfile"
    assert (env.docker_image, env.workdir) == (None, None)
    assert (env.build_timeout_sec, env.cpus, env.memory_mb, env.storage_mb) == (600.0, 1.0, 2048, 10240)
    assert env.allow_internet is False  # Harbor defaults to True; we do not
    assert env.base_packages_only is False
    (step,) = task.steps
    assert step.name == "main"
    assert step.instruction.startswith("Create /app/hello.txt")
    assert (step.agent_timeout_sec, step.verifier_timeout_sec) == (300.0, 120.0)
    assert step.tests_dirs == (task.path / "tests",)
    assert step.solution_dir == task.path / "solution"
    assert step.setup_script is None and step.min_reward is None and step.contributes_to_reward
    assert task.test_files(step) == {"test.sh": TEST_SH.encode()}
    assert task.solution_files(step) == {"solve.sh": SOLVE_SH.encode()}


def test_schema_1_1_fields_are_read(tmp_path: Path) -> None:
    task = load_quietly(write_task(tmp_path, toml=SCHEMA_1_1))
    assert task.name == "acme/hello-file" and task.schema_version == "1.1"
    assert task.description == "Write a greeting."
    assert [(a.name, a.email) for a in task.authors] == [("Ada", "ada@example.org"), ("Grace", None)]
    assert task.keywords == ("files", "shell")
    assert task.metadata["anything"] == {"goes": [1, 2]}
    assert task.solution_env == {"MODE": "oracle"}
    (step,) = task.steps
    assert (step.agent_timeout_sec, step.agent_user) == (200.0, "agent")
    assert (step.verifier_timeout_sec, step.verifier_env, step.verifier_user) == (90.0, {"EXPECTED": "hello"}, "root")
    env = task.environment
    assert (env.build_timeout_sec, env.cpus, env.memory_mb, env.storage_mb) == (900.0, 2.0, 4096, 20480)
    assert env.workdir == "/app" and env.allow_internet is True


def test_later_1_x_schema_is_read_like_1_1(tmp_path: Path) -> None:
    task = load_quietly(write_task(tmp_path, toml='schema_version = "1.3"\n'))
    assert task.schema_version == "1.3"


@pytest.mark.parametrize(("memory", "expected_mb"), [
    ('"2G"', 2048), ('"512M"', 512), ('"1024K"', 1), ('"1.5G"', 1536), ('"4Gi"', 4096), ("3072", 3072),
])
def test_deprecated_memory_spelling_is_normalised_to_mb(tmp_path: Path, memory: str, expected_mb: int) -> None:
    toml = f'version = "1.0"\n[environment]\nmemory = {memory}\nstorage = "20G"\n'
    env = load_quietly(write_task(tmp_path, toml=toml)).environment
    assert env.memory_mb == expected_mb
    assert env.storage_mb == 20480


def test_memory_mb_wins_over_memory_with_a_warning(tmp_path: Path) -> None:
    toml = 'version = "1.0"\n[environment]\nmemory = "8G"\nmemory_mb = 1024\n'
    with pytest.warns(HarborTaskWarning, match=r"both memory and memory_mb are set; memory_mb = 1024 is used"):
        task = load_task(write_task(tmp_path, toml=toml))
    assert task.environment.memory_mb == 1024


def test_unknown_keys_warn_naming_task_table_and_key(tmp_path: Path) -> None:
    toml = ('timeout = 5\n' + MINIMAL_TOML + '[task]\nauthors = [{ name = "Ada", mail = "a@b.c" }]\n'
            '[environment]\ncpu = 2\n[solution]\nenv = {}\nshell = "bash"\n')
    toml = toml.replace("[verifier]\n", "[verifier]\ntimout_sec = 3\n")
    task_dir = write_task(tmp_path, toml=toml)
    with pytest.warns(HarborTaskWarning) as record:
        task = load_task(task_dir)
    messages = [str(w.message) for w in record]
    assert messages == list(task.warnings)
    assert any("top level: unknown key 'timeout'" in m for m in messages)
    assert any("[verifier]: unknown key 'timout_sec' is ignored (did you mean 'timeout_sec'?)" in m for m in messages)
    assert any("[environment]: unknown key 'cpu'" in m and "did you mean 'cpus'" in m for m in messages)
    assert any("[solution]: unknown key 'shell'" in m for m in messages)
    assert all(str(task_dir / "task.toml") in m for m in messages)
    assert any("[task] authors[0]: unknown key 'mail'" in m and "did you mean 'email'" in m for m in messages)
    assert len(messages) == 5  # [metadata] is free-form: its keys never warn


def test_gpus_load_with_a_warning_that_none_are_provided(tmp_path: Path) -> None:
    toml = 'version = "1.0"\n[environment]\ngpus = 1\ngpu_types = ["H100"]\n'
    with pytest.warns(HarborTaskWarning, match="gpus = 1 is requested, but GPUs are not provided"):
        task = load_task(write_task(tmp_path, toml=toml))
    assert task.environment.gpus == 1


def test_skyrl_extension_declares_base_packages_only(tmp_path: Path) -> None:
    toml = MINIMAL_TOML + "[metadata.skyrl]\nbase_packages_only = true\n"
    assert load_quietly(write_task(tmp_path, toml=toml)).environment.base_packages_only is True


def test_unknown_skyrl_extension_key_warns(tmp_path: Path) -> None:
    toml = MINIMAL_TOML + "[metadata.skyrl]\nagent_user_root = true\n"
    with pytest.warns(HarborTaskWarning, match=r"\[metadata.skyrl\]: unknown key 'agent_user_root'"):
        load_task(write_task(tmp_path, toml=toml))


def test_prebuilt_docker_image_needs_no_dockerfile(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, toml='version = "1.0"\n[environment]\ndocker_image = "acme/task:1"\n')
    (task_dir / "environment" / "Dockerfile").unlink()
    env = load_quietly(task_dir).environment
    assert (env.docker_image, env.context_dir) == ("acme/task:1", None)


@pytest.mark.parametrize(("remove", "message"), [
    ("task.toml", "task.toml is missing"),
    ("instruction.md", "instruction.md is missing"),
    ("environment/Dockerfile", "environment/Dockerfile is missing"),
    ("tests/test.sh", "tests/test.sh is missing"),
])
def test_missing_files_are_errors_naming_folder_and_file(tmp_path: Path, remove: str, message: str) -> None:
    task_dir = write_task(tmp_path)
    (task_dir / remove).unlink()
    with pytest.raises(TaskFormatError, match=message) as info:
        load_task(task_dir)
    assert str(task_dir) in str(info.value)


def test_invalid_toml_is_an_error_with_tomllibs_reason(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, toml='version = "1.0"\n[verifier\n')
    with pytest.raises(TaskFormatError, match=r"task\.toml: invalid TOML: .*line 2"):
        load_task(task_dir)


@pytest.mark.parametrize(("toml", "message"), [
    ('[verifier]\ntimeout_sec = "x"\n', r"\[verifier\] timeout_sec must be a positive number, got str 'x'"),
    ("[agent]\ntimeout_sec = -5\n", r"\[agent\] timeout_sec must be a positive number, got int -5"),
    ("[environment]\nbuild_timeout_sec = 0\n", r"\[environment\] build_timeout_sec must be a positive number"),
    ("[environment]\nmemory = \"lots\"\n", r"\[environment\] memory must be a size such as"),
    ("[environment]\nmemory_mb = 1.5\n", r"\[environment\] memory_mb must be a whole number"),
    ("[environment]\nallow_internet = \"yes\"\n", r"\[environment\] allow_internet must be true or false"),
    ("[environment]\nworkdir = \"app\"\n", r"\[environment\] workdir must be an absolute path"),
    ("[environment]\nos = \"windows\"\n", r"\[environment\] os must be \"linux\""),
    ("[verifier]\nenv = { N = 3 }\n", r"\[verifier\] env.N must be a string, got int 3"),
    ('multi_step_reward_strategy = "max"\n', r"multi_step_reward_strategy must be one of mean, final, got str 'max'"),
    ('schema_version = "2.0"\n', r"schema_version must be a 1.x version string"),
    ("verifier = 3\n", r"\[verifier\] must be a table"),
])
def test_wrong_values_are_errors_naming_table_and_key(tmp_path: Path, toml: str, message: str) -> None:
    task_dir = write_task(tmp_path, toml=toml)
    with pytest.raises(TaskFormatError, match=message) as info:
        load_task(task_dir)
    assert str(task_dir / "task.toml") in str(info.value)


def write_multi_step(tmp_path: Path, toml: str = MULTI_STEP) -> Path:
    task_dir = write_task(tmp_path, "two-steps", toml=toml, solution=False,
                          extra={"tests/helper.py": "print('task helper')\n"})
    (task_dir / "instruction.md").unlink()
    write_files(task_dir / "steps", {
        "setup-repo/instruction.md": "Clone the repository into /app/repo.\n",
        "setup-repo/solution/solve.sh": "git clone /srv/repo /app/repo\n",
        "fix-bug/instruction.md": "Fix the failing test in /app/repo.\n",
        "fix-bug/setup.sh": "echo bug > /app/repo/bug.txt\n",
        "fix-bug/tests/test.sh": "#!/bin/bash\necho step test\n",
        "fix-bug/tests/data/expected.txt": "ok\n",
    })
    return task_dir


def test_multi_step_task_layers_tests_and_falls_back_to_task_settings(tmp_path: Path) -> None:
    task = load_quietly(write_multi_step(tmp_path))
    assert task.multi_step is True and task.reward_strategy == "final"
    first, second = task.steps
    assert (first.name, second.name) == ("setup-repo", "fix-bug")
    assert first.instruction == "Clone the repository into /app/repo.\n"
    assert (first.min_reward, first.contributes_to_reward) == (1.0, True)
    assert (first.agent_timeout_sec, first.agent_user) == (50.0, None)
    assert (first.verifier_timeout_sec, first.verifier_env) == (100.0, {"LEVEL": "task", "SHARED": "yes"})
    assert first.solution_dir == task.path / "steps" / "setup-repo" / "solution" and first.setup_script is None
    assert (second.min_reward, second.contributes_to_reward) == (None, False)
    assert (second.agent_timeout_sec, second.agent_user, second.verifier_user) == (70.0, "dev", "checker")
    assert second.verifier_timeout_sec == 100.0
    assert second.verifier_env == {"LEVEL": "step", "SHARED": "yes"}
    assert second.setup_script == task.path / "steps" / "fix-bug" / "setup.sh"
    assert second.solution_dir is None
    assert task.test_files(first) == {"test.sh": TEST_SH.encode(), "helper.py": b"print('task helper')\n"}
    assert task.test_files(second) == {"test.sh": b"#!/bin/bash\necho step test\n",
                                       "helper.py": b"print('task helper')\n", "data/expected.txt": b"ok\n"}
    assert task.solution_files(first) == {"solve.sh": b"git clone /srv/repo /app/repo\n"}
    assert task.solution_files(second) == {}


def test_multi_step_strategy_defaults_to_mean(tmp_path: Path) -> None:
    toml = MULTI_STEP.replace('multi_step_reward_strategy = "final"\n', "")
    assert load_quietly(write_multi_step(tmp_path, toml)).reward_strategy == "mean"


def test_unknown_step_keys_warn_naming_the_step(tmp_path: Path) -> None:
    toml = MULTI_STEP.replace('min_reward = 1.0\n', 'min_reward = 1.0\nweight = 2\n')
    with pytest.warns(HarborTaskWarning, match=r"\[\[steps\]\] 'setup-repo': unknown key 'weight'"):
        load_task(write_multi_step(tmp_path, toml))


@pytest.mark.parametrize(("change", "message"), [
    (('name = "fix-bug"', 'name = "setup-repo"'), r"\[\[steps\]\] #2 duplicate step name 'setup-repo'"),
    (('name = "fix-bug"', 'name = ".."'), r"\[\[steps\]\] #2 name must be a safe folder name"),
    (('name = "fix-bug"', 'name = "fix/bug"'), r"\[\[steps\]\] #2 name must be a safe folder name"),
    (('name = "fix-bug"', 'name = "deploy"'), r"step 'deploy' has no folder steps/deploy/"),
    (("min_reward = 1.0", 'min_reward = "high"'), r"\[\[steps\]\] 'setup-repo' min_reward must be a number"),
    (("[steps.agent]\ntimeout_sec = 70", "[steps.agent]\ntimeout_sec = -1"),
     r"\[\[steps\]\] 'fix-bug' agent timeout_sec must be a positive number"),
])
def test_bad_steps_are_errors(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    task_dir = write_multi_step(tmp_path, MULTI_STEP.replace(*change))
    with pytest.raises(TaskFormatError, match=message):
        load_task(task_dir)


def test_step_without_instruction_is_an_error(tmp_path: Path) -> None:
    task_dir = write_multi_step(tmp_path)
    (task_dir / "steps" / "fix-bug" / "instruction.md").unlink()
    with pytest.raises(TaskFormatError, match=r"steps/fix-bug: instruction.md is missing"):
        load_task(task_dir)


def test_step_needs_a_test_script_from_task_or_step(tmp_path: Path) -> None:
    task_dir = write_multi_step(tmp_path)
    (task_dir / "tests" / "test.sh").unlink()
    with pytest.raises(TaskFormatError, match=r"step 'setup-repo' has no test.sh"):
        load_task(task_dir)


def test_test_files_follow_symlinks_inside_the_task_only(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, extra={"shared/expected.txt": "hello\n"})
    os.symlink("../shared/expected.txt", task_dir / "tests" / "expected.txt")
    task = load_quietly(task_dir)
    assert task.test_files(task.steps[0])["expected.txt"] == b"hello\n"
    (tmp_path / "secret.txt").write_text("host secret")
    os.symlink(tmp_path / "secret.txt", task_dir / "tests" / "leak.txt")
    with pytest.raises(TaskFormatError, match=r"leak.txt: symlink points outside the task folder"):
        task.test_files(task.steps[0])


@pytest.mark.parametrize("link", ["tests", "instruction.md"])
def test_symlinked_tests_folder_or_instruction_may_not_leave_the_task(tmp_path: Path, link: str) -> None:
    task_dir = write_task(tmp_path / "tasks")
    outside = write_task(tmp_path, "elsewhere")
    target = task_dir / link
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    os.symlink(outside / link, target)
    with pytest.raises(TaskFormatError, match=f"{link}: symlink points outside the task folder"):
        task = load_task(task_dir)
        task.test_files(task.steps[0])


def test_task_pickles(tmp_path: Path) -> None:
    task = load_quietly(write_multi_step(tmp_path))
    assert pickle.loads(pickle.dumps(task)) == task


@pytest.mark.parametrize(("strategy", "rewards", "contributes", "expected"), [
    ("mean", [1.0, 0.5], [True, True], 0.75),
    ("mean", [1.0], [True, True], 0.5),  # the second step was not reached
    ("mean", [1.0, None, 1.0], [True, True, True], 2 / 3),  # a step without a result counts 0
    ("mean", [0.2, 1.0], [False, True], 1.0),
    ("final", [1.0, 0.25, 0.9], [True, True, False], 0.25),
    ("final", [1.0, None], [True, True], 0.0),
    ("final", [0.7], [False], 0.0),
    ("mean", [], [False, False], 0.0),
])
def test_combine_rewards(strategy: str, rewards: list, contributes: list[bool], expected: float) -> None:
    assert combine_rewards(strategy, rewards, contributes) == pytest.approx(expected)


def test_combine_rewards_rejects_unknown_strategy_and_extra_rewards() -> None:
    with pytest.raises(ValueError, match="unknown reward strategy 'max'"):
        combine_rewards("max", [1.0], [True])
    with pytest.raises(ValueError, match="2 step rewards for 1 steps"):
        combine_rewards("mean", [1.0, 1.0], [True])
