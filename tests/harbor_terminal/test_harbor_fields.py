"""Harbor's newer task.toml fields (schema 1.4) are honoured or refused by name, never silently ignored.

``tasks/harbor-init/separate-demo`` is what ``harbor init --task h4org/separate-demo`` (Harbor 0.25.0) writes,
with its empty instruction filled in (its tests image pulls from ghcr.io, so it is not run here): it must load
without a warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from skyrl_harbor_terminal.provision import TaskEnvironmentError, bwrap_recipe
from skyrl_harbor_terminal.task import TaskFormatError, load_task
from task_fixtures import BASE_IMAGE, write_task

HARBOR_INIT = Path(__file__).parent / "tasks" / "harbor-init" / "separate-demo"
HEAD = 'schema_version = "1.4"\n[task]\nname = "t/fields"\n'


def load(tmp_path: Path, toml: str, extra: dict[str, str] | None = None):
    return load_task(write_task(tmp_path, toml=HEAD + toml, extra=extra), quiet=True)


def refused(tmp_path: Path, toml: str, extra: dict[str, str] | None = None) -> str:
    with pytest.raises(TaskFormatError) as caught:
        load(tmp_path, toml, extra)
    return str(caught.value)


def test_a_task_made_by_harbor_init_loads_without_warnings_and_runs_its_tests_apart():
    task = load_task(HARBOR_INIT, quiet=True)
    assert task.warnings == ()
    assert task.version == "1.0.0" and task.environment.allow_internet  # network_mode = "public"
    machine = task.steps[0].tests_machine
    assert machine is not None and machine.context_dir == HARBOR_INIT / "tests" and machine.allow_internet
    assert task.separate_tests


def test_the_package_version_and_source_are_kept_without_warnings(tmp_path: Path):
    task = load(tmp_path, 'version = "2.1.0-rc1"\n', extra={})
    assert task.version == "2.1.0-rc1" and task.warnings == ()
    task = load_task(write_task(tmp_path, "with-source", toml='source = "cookbook"\n' + HEAD), quiet=True)
    assert task.source == "cookbook" and task.warnings == ()


@pytest.mark.parametrize(("table", "network"), [
    ('[environment]\nnetwork_mode = "public"\n', True),
    ('[environment]\nnetwork_mode = "no-network"\n', False),
    ("[environment]\nallow_internet = true\n", True),
    ("", False),  # ours: off unless the task asks (Harbor: public)
    ('[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "no-network"\n', False),
    ('[agent]\nnetwork_mode = "public"\n', True),
])
def test_network_mode_sets_the_agents_machine_network(tmp_path: Path, table: str, network: bool):
    task = load(tmp_path, table)
    assert task.environment.allow_internet is network and task.warnings == ()


def test_network_mode_wins_over_allow_internet_and_says_so(tmp_path: Path):
    task = load(tmp_path, '[environment]\nallow_internet = true\nnetwork_mode = "no-network"\n')
    assert task.environment.allow_internet is False
    assert any("allow_internet = true is overridden by network_mode" in w for w in task.warnings), task.warnings


@pytest.mark.parametrize(("table", "named"), [
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "allowed_hosts"),
    ('[environment]\nnetwork_mode = "allowlist"\n', 'network_mode = "allowlist" is not supported'),
    ('[agent]\nnetwork_mode = "allowlist"\n', '[agent] network_mode = "allowlist"'),
    ('[environment]\nnetwork_mode = "offline"\n', "network_mode must be"),
    ('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
     "[verifier] network_mode differs from the agent's machine"),
])
def test_network_modes_that_cannot_be_honoured_are_refused_by_name(tmp_path: Path, table: str, named: str):
    assert named in refused(tmp_path, table)


def test_separate_tests_use_the_tests_dockerfile_else_the_tasks_image_and_their_own_network(tmp_path: Path):
    toml = '[verifier]\nenvironment_mode = "separate"\nnetwork_mode = "public"\n'
    task = load(tmp_path, toml, extra={"tests/Dockerfile": f"FROM {BASE_IMAGE}\nCOPY . /tests/\n"})
    machine = task.steps[0].tests_machine
    assert machine is not None and machine.context_dir == tmp_path / "hello-file" / "tests" and machine.allow_internet
    assert task.environment.allow_internet is False  # the agent's machine keeps its own
    task = load_task(write_task(tmp_path, "no-dockerfile", toml=HEAD + '[verifier]\nenvironment_mode = "separate"\n'),
                     quiet=True)
    machine = task.steps[0].tests_machine
    assert machine is not None and machine.context_dir is None and not machine.allow_internet
    shared = load_task(write_task(tmp_path, "shared", toml=HEAD + '[verifier]\nenvironment_mode = "shared"\n'),
                       quiet=True)
    assert shared.steps[0].tests_machine is None and not shared.separate_tests


@pytest.mark.parametrize(("toml", "extra", "named"), [
    ('[verifier]\nenvironment_mode = "apart"\n', {}, 'environment_mode must be "shared" or "separate"'),
    ('[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\ndocker_image = "x"\n', {},
     "[verifier] environment (a table defining the tests' own machine) is not supported"),
    ('[verifier]\nenvironment_mode = "separate"\n', {"tests/docker-compose.yaml": "services: {}\n"},
     "tests/docker-compose.yaml is not supported"),
])
def test_verifier_environments_that_cannot_be_honoured_are_refused_by_name(tmp_path: Path, toml: str, extra: dict,
                                                                          named: str):
    assert named in refused(tmp_path, toml, extra)


def test_a_steps_own_tests_dockerfile_and_mode_win_over_the_tasks(tmp_path: Path):
    toml = ('[verifier]\nenvironment_mode = "separate"\n'
            '[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n[steps.verifier]\nenvironment_mode = "shared"\n')
    step_files = {f"steps/{name}/{file}": text for name in ("one", "two")
                  for file, text in (("instruction.md", "Do it.\n"), ("tests/test.sh", "#!/bin/bash\nexit 0\n"))}
    task = load(tmp_path, toml, extra={**step_files, "tests/Dockerfile": f"FROM {BASE_IMAGE}\n",
                                       "steps/one/tests/Dockerfile": f"FROM {BASE_IMAGE}\n"})
    one, two = task.steps
    assert one.tests_machine is not None and one.tests_machine.context_dir == tmp_path / "hello-file/steps/one/tests"
    assert two.tests_machine is None


def test_collect_commands_are_read_for_the_agents_machine_and_refused_for_other_services(tmp_path: Path):
    toml = ('[[verifier.collect]]\ncommand = "cp /app/db /logs/artifacts/"\ntimeout_sec = 5\nuser = 1000\n'
            '[[verifier.collect]]\ncommand = "true"\nservice = "main"\n')
    first, second = load(tmp_path, toml).steps[0].collect
    assert (first.command, first.timeout_sec, first.user) == ("cp /app/db /logs/artifacts/", 5.0, "1000")
    assert (second.command, second.timeout_sec, second.user) == ("true", 60.0, None)
    assert ("[verifier] collect[0] service = 'db' is not supported"
            in refused(tmp_path, '[[verifier.collect]]\ncommand = "pg_dump"\nservice = "db"\n'))
    assert "[verifier] collect[0] needs a command" in refused(tmp_path, '[[verifier.collect]]\nuser = "root"\n')
    assert "[verifier] collect must be a list" in refused(tmp_path, '[verifier]\ncollect = "true"\n')


def test_the_bwrap_backend_refuses_tests_that_run_apart(tmp_path: Path):
    toml = '[metadata.skyrl]\nbase_packages_only = true\n[verifier]\nenvironment_mode = "separate"\n'
    with pytest.raises(TaskEnvironmentError, match=r'needs a container runtime \(docker\b.*\): its tests run in a '
                                                   r'machine of their own \(\[verifier\] environment_mode = '
                                                   r'"separate"\)'):
        bwrap_recipe(load(tmp_path, toml), "bwrap")
