"""The task lint: tests that run what the policy can write are reported by file, line and rule; safe ones are not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from skyrl_core.testing.check import SKIPPABLE
from skyrl_harbor_terminal.dataset import load_tasks
from skyrl_harbor_terminal.env import BUILTIN_TASKS
from skyrl_harbor_terminal.lint import lint_task, task_workdir
from skyrl_harbor_terminal.task import HarborTaskWarning, load_task
from task_fixtures import MINIMAL_TOML, write_task

REWARD = 'if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'
# Terminal-Bench 2's usual test.sh, here with an explicit cd into the work directory.
TB2_TEST_SH = """\
#!/bin/bash
cd /app
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
uv venv .tbench-testing
source .tbench-testing/bin/activate
uv pip install pytest==8.4.1
uv run pytest /tests/test_outputs.py -rA
""" + REWARD
TB2_TEST_OUTPUTS = """\
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, "/app")


def test_output_file():
    assert Path("/app/out.txt").read_text().strip() == "42"


def test_program_prints_the_answer():
    result = subprocess.run(["python3", "/app/main.py"], capture_output=True, text=True, timeout=10)
    assert result.stdout.strip() == "42"


def test_listing_is_only_read():
    result = subprocess.run(["cat", "/app/out.txt"], capture_output=True, text=True)
    assert result.returncode == 0
"""
SAFE_TEST_SH = """\
#!/bin/bash
# Reads the agent's files as data only, and runs nothing from /app.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
cd / || exit 0
F=/app/out.txt
[ -f "$F" ] && [ ! -L "$F" ] || exit 0
[ "$(cat /app/out.txt)" = 42 ] || exit 0
diff <(sort /app/list.txt) /tests/expected.txt || exit 0
sha256sum < /app/out.txt
python3 -I /tests/check.py /app/out.txt || exit 0
case "$(head -c 20 /app/answer.txt)" in
    run.sh | /app/run.sh) ;;
    *) exit 0 ;;
esac
cd /app && python3 -I -m pytest /tests/test_outputs.py && cd /
cd /app && python3 -I -m unittest discover -s /tests -p 'test_*.py' && python3 -I -m pytest -k 'x.py' /tests && cd /
cd /app
uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
cd /
python3 /tests/check.py
pytest /tests/test_outputs.py -rA
echo 1 > "$REWARD"
"""
SAFE_CHECK_PY = """\
import json
import subprocess
import sys

with open("/app/out.txt") as handle:
    answer = handle.read().strip()
FILES = ["/app/out.txt", "/app/list.txt"]
subprocess.run(["diff", "/app/list.txt", "/tests/expected.txt"], check=True)
sys.path.insert(0, "/tests")
print(json.dumps({"answer": answer}))
"""


def load(task_dir: Path, on_warning: str = "ignore"):
    """The task; its loader warnings ignored, or with ``on_warning="error"`` raised."""
    with warnings.catch_warnings():
        warnings.simplefilter(on_warning, HarborTaskWarning)
        return load_task(task_dir)


def findings(task_dir: Path) -> list[tuple[str, int, str]]:
    return [(f.path, f.line, f.rule) for f in lint_task(load(task_dir))]


def test_terminal_bench_style_test_sh_and_test_outputs_are_flagged(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": TB2_TEST_SH, "tests/test_outputs.py": TB2_TEST_OUTPUTS})
    assert findings(task_dir) == [
        ("tests/test.sh", 5, "runs-in-workdir"),  # uv venv, in /app: uv reads /app/uv.toml
        ("tests/test.sh", 6, "agent-code"),  # source .tbench-testing/bin/activate, in /app
        ("tests/test.sh", 7, "runs-in-workdir"),  # uv pip install
        ("tests/test.sh", 8, "runs-in-workdir"),  # uv run
        ("tests/test_outputs.py", 5, "agent-path"),  # sys.path.insert(0, "/app")
        ("tests/test_outputs.py", 13, "agent-code"),  # subprocess.run(["python3", "/app/main.py"])
    ]
    (finding, *_) = [f for f in lint_task(load(task_dir)) if f.rule == "runs-in-workdir"]
    assert "pyproject.toml" in finding.message and "cd /tests" in finding.message


def test_tests_that_start_in_the_workdir_as_harbor_starts_them(tmp_path: Path) -> None:
    no_cd = TB2_TEST_SH.replace("cd /app\n", "if [ \"$PWD\" = / ]; then exit 1; fi\n")
    task = load(write_task(tmp_path, extra={"tests/test.sh": no_cd}))
    assert lint_task(task) == []  # our verifier starts test.sh in /tests
    assert [(f.line, f.rule) for f in lint_task(task, cwd="/app")] == [
        (5, "runs-in-workdir"), (6, "agent-code"), (7, "runs-in-workdir"), (8, "runs-in-workdir")]


@pytest.mark.parametrize(("line", "rule"), [
    ("bash /app/solution.sh", "agent-code"),
    ("source /app/env.sh", "agent-code"),
    ("cd /app && ./run.sh", "agent-code"),
    ("timeout 10 python3 /app/solution.py", "agent-code"),
    ("cd /app/project; make test", "agent-code"),
    ("sudo -u agent bash -c 'cd /app && bash build.sh'", "agent-code"),
    ("export PYTHONPATH=/app:$PYTHONPATH", "agent-path"),
    ("APP=/app; PATH=$APP/bin:$PATH python3 -I /tests/check.py", "agent-path"),
    ("cd /app; python -m pytest /tests/test_outputs.py", "runs-in-workdir"),
    ("cd /app && python3 -E -c 'import json'", "runs-in-workdir"),
    ("cd /app && uv pip install -r /tests/requirements.txt", "runs-in-workdir"),
    ("cd /app && uv run --with pytest==8.4.1 python -I -m pytest /tests/test_outputs.py", "runs-in-workdir"),
    ("uvx -p 3.13 -w pytest==8.4.1 pytest /app/test_outputs.py", "agent-tests"),
    ("pytest /app/tests -rA", "agent-tests"),
    ("cd /app && pytest", "agent-tests"),
    ("python3 -I -m unittest discover -s /app/tests", "agent-tests"),
])
def test_each_rule_names_the_line(tmp_path: Path, line: str, rule: str) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": f"#!/bin/bash\n# a test\n{line}\n{REWARD}"})
    assert ("tests/test.sh", 3, rule) in findings(task_dir)


def test_python_in_a_heredoc_and_python_calls_are_read(tmp_path: Path) -> None:
    test_sh = "#!/bin/bash\ncd /app\npython3 -I - <<'EOF'\nimport sys\nsys.path.insert(0, '')\nimport solution\nEOF\n"
    test_py = ('import os, runpy, subprocess\nos.system("bash /app/run.sh")\nrunpy.run_path("/app/solution.py")\n'
               'subprocess.run(["./run.sh"], cwd="/app")\nsubprocess.run(\n    ["node", "/app/index.js"],\n)\n')
    task_dir = write_task(tmp_path, extra={"tests/test.sh": test_sh, "tests/test_it.py": test_py})
    assert findings(task_dir) == [
        ("tests/test.sh", 5, "agent-path"),
        ("tests/test_it.py", 2, "agent-code"),
        ("tests/test_it.py", 3, "agent-code"),
        ("tests/test_it.py", 4, "agent-code"),
        ("tests/test_it.py", 6, "agent-code"),
    ]


def test_safe_idioms_are_not_flagged(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": SAFE_TEST_SH, "tests/check.py": SAFE_CHECK_PY})
    assert load(task_dir, "error").warnings == ()


def test_a_declared_task_gets_only_the_findings_declaring_does_not_cover(tmp_path: Path) -> None:
    toml = MINIMAL_TOML + "\n[metadata.skyrl]\ntests_run_agent_code = true\n"
    test_sh = "#!/bin/bash\nsetpriv --reuid=agent --regid=agent --clear-groups -- bash /app/solution.sh\n" \
              "cd /app && python -m pytest /tests/test_outputs.py\n" + REWARD
    task_dir = write_task(tmp_path, toml=toml, extra={"tests/test.sh": test_sh})
    assert findings(task_dir) == [("tests/test.sh", 3, "runs-in-workdir")]
    undeclared = write_task(tmp_path, "undeclared", extra={"tests/test.sh": test_sh})
    (first, second) = lint_task(load(undeclared))
    assert (first.line, first.rule) == (2, "agent-code")
    assert "declare [metadata.skyrl] tests_run_agent_code = true" in first.message
    assert "python -I" in second.message


def test_the_workdir_comes_from_task_toml_else_the_dockerfile(tmp_path: Path) -> None:
    test_sh = "#!/bin/bash\nbash /app/run.sh\nbash /srv/project/run.sh\n" + REWARD
    toml = MINIMAL_TOML + '\n[environment]\nworkdir = "/srv/project"\n'
    from_toml = write_task(tmp_path, "from-toml", toml=toml, extra={"tests/test.sh": test_sh})
    from_dockerfile = write_task(tmp_path, "from-dockerfile", extra={
        "tests/test.sh": test_sh, "environment/Dockerfile": "FROM skyrl-terminal-base:bookworm-1\nWORKDIR /srv\n"
                                                            "WORKDIR project\n"})
    default = write_task(tmp_path, "default", extra={
        "tests/test.sh": test_sh, "environment/Dockerfile": "FROM skyrl-terminal-base:bookworm-1\n"})
    for task_dir, workdir, line in ((from_toml, "/srv/project", 3), (from_dockerfile, "/srv/project", 3),
                                    (default, "/app", 2)):
        assert task_workdir(load(task_dir)) == workdir
        assert findings(task_dir) == [("tests/test.sh", line, "agent-code")]


def test_step_tests_are_linted_and_named_by_their_path(tmp_path: Path) -> None:
    toml = MINIMAL_TOML + '\n[[steps]]\nname = "build"\n\n[[steps]]\nname = "check"\n'
    task_dir = write_task(tmp_path, toml=toml, extra={
        "tests/helpers.sh": "#!/bin/bash\ncd /app\n./configure\n",
        "steps/build/instruction.md": "Build it.\n",
        "steps/build/tests/test.sh": "#!/bin/bash\n" + REWARD,
        "steps/check/instruction.md": "Check it.\n",
        "steps/check/tests/test.sh": "#!/bin/bash\nbash /tests/helpers.sh\nbash /app/check.sh\n" + REWARD,
    })
    assert findings(task_dir) == [("steps/check/tests/test.sh", 3, "agent-code"),
                                  ("tests/helpers.sh", 3, "agent-code")]


def test_an_ignore_comment_silences_its_line(tmp_path: Path) -> None:
    test_sh = ("#!/bin/bash\nbash /app/a.sh  # skyrl-lint: ignore\nbash /app/b.sh  # skyrl-lint: ignore agent-code\n"
               "bash /app/c.sh  # skyrl-lint: ignore agent-tests\n" + REWARD)
    task_dir = write_task(tmp_path, extra={"tests/test.sh": test_sh})
    assert findings(task_dir) == [("tests/test.sh", 4, "agent-code")]


def test_the_loader_warns_naming_the_file_and_line(tmp_path: Path) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": "#!/bin/bash\nbash /app/solution.sh\n" + REWARD})
    with pytest.warns(HarborTaskWarning) as record:
        task = load_task(task_dir)
    (message,) = [str(w.message) for w in record]
    assert message.startswith(f"{task_dir}/tests/test.sh:2: agent-code: bash runs /app/solution.sh")
    assert task.warnings == (message,)


def test_skyrl_check_prints_the_findings_as_warnings_without_failing(skyrl_cli, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    write_task(tasks, "gameable", extra={"tests/test.sh": "#!/bin/bash\ncd /app\n./run_tests.sh\n" + REWARD})
    write_task(tasks, "clean")
    skips = [arg for family in SKIPPABLE for arg in ("--skip", family)]  # the lint needs no machine
    result = skyrl_cli("check", "harbor_terminal", *skips, f"env.tasks={tasks}")
    assert result.exit_code == 0, result.output
    warn, left_out = [line for line in result.output.splitlines() if line.startswith("WARN  ")]
    assert warn.startswith(f"WARN  {tasks}/gameable/tests/test.sh:3: agent-code: runs ./run_tests.sh")
    assert "1 of 2 task(s) left out of split 'train'" in left_out and "gameable (tests/test.sh:3" in left_out
    assert result.output.rstrip().endswith("2 warning(s)")


def test_builtin_tasks_lint_clean() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", HarborTaskWarning)
        tasks = load_tasks(BUILTIN_TASKS)
    assert tasks and all(task.warnings == () for task in tasks)
    assert [finding for task in tasks for finding in lint_task(task)] == []


# Each class of attack the lint covers beyond running a file: (test line, rule), then a clean twin of it.
ATTACKS = [
    ("cat /app/steps.txt | bash", "agent-code"),  # the agent's text piped into a shell
    ("bash < /app/check.sh", "agent-code"),
    ("source <(cat /app/env.sh)", "agent-code"),
    ('eval "$(cat /app/cmd.txt)"', "agent-code"),
    ("git -C /app/repo status --porcelain", "agent-code"),  # core.fsmonitor in its .git/config runs
    ("cd /app/repo && git commit -qm check", "agent-code"),  # .git/hooks/pre-commit runs
    ("GIT_DIR=/app/repo/.git git log -1", "agent-path"),
    ("export HOME=/app", "agent-path"),  # ~/.gitconfig, ~/.bashrc, user site-packages .pth are the agent's
    ("PYTHONUSERBASE=/app/.local python3 -I /tests/check.py", "agent-path"),
    ("pip install /app/pkg", "agent-code"),  # its setup.py runs
    ("cd /app && python3 -I -m pip install -e .", "agent-code"),
    ("python3 -I -m pytest -c /app/pytest.ini /tests/test_outputs.py", "agent-code"),  # addopts = -p its plugin
]
CLEAN_TWINS = [
    "cat /app/steps.txt | wc -l",
    "python3 -I /tests/check.py < /app/answer.txt",
    "diff <(sort /app/list.txt) /tests/expected.txt",
    'echo "$(cat /app/cmd.txt)"',
    "git -C /tests/fixture status --porcelain",
    "GD=$(mktemp -d); git --git-dir=\"$GD\" log -1",
    "export HOME=/root",
    "curl -fsSL https://example.invalid/install.sh | sh",
    "pip install --target /app/vendor requests==2.32.3",
    "cd /app && pip install pytest==8.4.1",
    "python3 -I -m pytest -c /tests/pytest.ini /tests/test_outputs.py",
    "git clone -q /app/repo /tmp/copy",
]


@pytest.mark.parametrize(("line", "rule"), ATTACKS)
def test_each_new_attack_class_is_reported_with_its_line_and_fix(tmp_path: Path, line: str, rule: str) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": f"#!/bin/bash\n# a test\n{line}\n{REWARD}"})
    (finding,) = [f for f in lint_task(load(task_dir)) if f.line == 3 and f.rule == rule]
    assert "can write" in finding.message
    assert any(fix in finding.message for fix in ("declare [metadata.skyrl]", "run git as the agent user",
                                                  "keep the settings in /tests"))


@pytest.mark.parametrize("line", CLEAN_TWINS)
def test_the_clean_twins_are_not_reported(tmp_path: Path, line: str) -> None:
    task_dir = write_task(tmp_path, extra={"tests/test.sh": f"#!/bin/bash\n{line}\n{REWARD}"})
    assert findings(task_dir) == []


def test_python_tests_that_hand_git_or_home_to_the_agent_are_reported(tmp_path: Path) -> None:
    test_py = ('import os, subprocess\nsubprocess.run(["git", "diff", "--stat"], cwd="/app/repo")\n'
               'os.environ["HOME"] = "/app"\nsubprocess.run(["git", "status"], cwd="/tests")\n')
    task_dir = write_task(tmp_path, extra={"tests/test_repo.py": test_py})
    assert findings(task_dir) == [("tests/test_repo.py", 2, "agent-code"), ("tests/test_repo.py", 3, "agent-path")]


def test_a_later_steps_setup_is_linted_and_the_first_steps_is_not(tmp_path: Path) -> None:
    toml = MINIMAL_TOML + '\n[[steps]]\nname = "one"\n\n[[steps]]\nname = "two"\n'
    setup = "#!/bin/bash\n# runs as root after the agent's first step\nbash ./migrate.sh\n"
    task_dir = write_task(tmp_path, toml=toml, extra={
        "steps/one/instruction.md": "One.\n", "steps/one/setup.sh": setup, "steps/one/tests/test.sh": "#!/bin/bash\n",
        "steps/two/instruction.md": "Two.\n", "steps/two/setup.sh": setup, "steps/two/tests/test.sh": "#!/bin/bash\n"})
    (finding,) = lint_task(load(task_dir))
    assert (finding.path, finding.line, finding.rule) == ("steps/two/setup.sh", 3, "agent-code")


def test_folders_the_dockerfile_hands_to_the_agent_are_the_agents(tmp_path: Path) -> None:
    dockerfile = ("FROM skyrl-terminal-base:bookworm-1\nWORKDIR /app\nRUN chmod -R 777 /opt/tool && "
                  "chown -R agent:agent /etc/profile.d /usr/local/lib/python3.11/site-packages\nRUN chmod 755 /srv\n")
    test_sh = ("#!/bin/bash\nbash /opt/tool/run.sh\nbash /srv/run.sh\nbash -lc 'true'\nsu - agent -c true\n"
               "sudo -u agent -i true\nPYTHONPATH=/usr/local/lib/python3.11/site-packages python3 /tests/x.py\n")
    task_dir = write_task(tmp_path, extra={"environment/Dockerfile": dockerfile, "tests/test.sh": test_sh})
    assert findings(task_dir) == [("tests/test.sh", 2, "agent-code"), ("tests/test.sh", 4, "agent-code"),
                                  ("tests/test.sh", 7, "agent-path")]
    (login,) = [f for f in lint_task(load(task_dir)) if f.line == 4]
    assert "/etc/profile.d/*.sh" in login.message and "functions" in login.message
