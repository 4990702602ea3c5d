"""Test helpers shared by tasks (``[metadata.skyrl] test_helpers``): one copy in the package, in every /tests that
asks for it; and the ones the built-in tasks share, ``verifier.sh`` (every verifier's opening) and ``tree_check.py``,
run as their verifiers run them."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skyrl_harbor_terminal.env import BUILTIN_TASKS
from skyrl_harbor_terminal.task import HarborTask, TaskFormatError, load_task
from skyrl_harbor_terminal.task_model import TEST_HELPERS_DIR
from skyrl_sandbox.backends.bwrap.plan import bwrap_base_argv
from task_fixtures import MINIMAL_TOML, TEST_SH, write_files, write_task

TREE_CHECK = TEST_HELPERS_DIR / "tree_check.py"
VERIFIER_SH = TEST_HELPERS_DIR / "verifier.sh"
SOURCE_LINE = ". /tests/verifier.sh || exit 1"
WITH_HELPER = MINIMAL_TOML + '\n[metadata.skyrl]\ntest_helpers = ["tree_check.py"]\n'


def test_a_task_that_names_a_helper_gets_the_packages_copy_beside_its_tests(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, toml=WITH_HELPER, extra={"tests/expected_tree.json": "{}\n"}))
    assert task.test_helpers == ("tree_check.py",)
    assert task.test_files(task.steps[0]) == {"tree_check.py": TREE_CHECK.read_bytes(), "test.sh": TEST_SH.encode(),
                                              "expected_tree.json": b"{}\n"}


def test_a_task_without_the_key_gets_no_helper(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path))
    assert task.test_helpers == () and set(task.test_files(task.steps[0])) == {"test.sh"}


def test_a_tasks_own_copy_of_a_helper_wins(tmp_path: Path) -> None:
    """A task folder made to run without this package (its own tree_check.py in tests/) keeps working here."""
    task = load_task(write_task(tmp_path, toml=WITH_HELPER, extra={"tests/tree_check.py": "print('own')\n"}))
    assert task.test_files(task.steps[0])["tree_check.py"] == b"print('own')\n"


@pytest.mark.parametrize(("value", "message"), [
    ('["nope.py"]', r"test_helpers names 'nope.py', which is not a test helper of skyrl-harbor-terminal "
                    r"\(there are: tree_check.py, verifier.sh\)"),
    ('["../task.py"]', r"test_helpers names '../task.py', which is not a test helper"),
    ('["__pycache__"]', r"test_helpers names '__pycache__', which is not a test helper"),
    ('["tree_check.py", "tree_check.py"]', r"test_helpers names a helper twice"),
    ('"tree_check.py"', r"test_helpers must be a list of strings"),
])
def test_a_bad_helper_list_is_an_error(tmp_path: Path, value: str, message: str) -> None:
    toml = MINIMAL_TOML + f"\n[metadata.skyrl]\ntest_helpers = {value}\n"
    with pytest.raises(TaskFormatError, match=message):
        load_task(write_task(tmp_path, toml=toml))


# --- the built-in tasks -----------------------------------------------------------------------------------------

def builtin_tasks() -> list[HarborTask]:
    return [load_task(path) for path in sorted(BUILTIN_TASKS.iterdir()) if (path / "task.toml").is_file()]


def test_builtin_tasks_share_one_tree_check_and_each_user_declares_it() -> None:
    users = set()
    for task in builtin_tasks():
        task_dir = task.path
        for folder in dict.fromkeys(folder for step in task.steps for folder in step.tests_dirs):
            assert not (folder / "tree_check.py").exists(), f"{folder}: a copy of the shared helper"
            test_sh = folder / "test.sh"
            if test_sh.is_file() and "/tests/tree_check.py" in test_sh.read_text():
                users.add(task_dir.name)
                assert task.test_helpers == ("verifier.sh", "tree_check.py"), task_dir
                assert json.loads((folder / "expected_tree.json").read_text()), folder
    assert users == {"archive-logs", "delete-large-files", "rename-txt-to-md", "sort-files-by-extension",
                     "word-counter-project"}


def test_every_builtin_verifier_opens_with_the_shared_verifier_sh_and_declares_it() -> None:
    """The opening (reward 0, fail, cd /, as_agent, /tests closed) is written once, in verifier.sh: each test.sh
    sources it first (from /tests, never from a folder the agent can write) and repeats none of it."""
    verifiers = 0
    for task in builtin_tasks():
        assert "verifier.sh" in task.test_helpers, task.path
        for step in task.steps:
            assert task.test_files(step)["verifier.sh"] == VERIFIER_SH.read_bytes(), (task.path, step.name)
        for folder in dict.fromkeys(folder for step in task.steps for folder in step.tests_dirs):
            assert not (folder / "verifier.sh").exists(), f"{folder}: a copy of the shared helper"
            if not (folder / "test.sh").is_file():
                continue
            verifiers += 1
            text = (folder / "test.sh").read_text()
            lines = text.splitlines()
            commands = [line for line in lines if line.strip() and not line.startswith("#")]
            assert lines[0] == "#!/bin/bash" and commands[0] == SOURCE_LINE, folder
            assert lines[1].startswith("# "), f"{folder}: test.sh lost its explanatory comment"
            for repeated in ("/logs/verifier", "fail() {", "as_agent() {", "chmod -R go-rwx /tests", "cd /\n"):
                assert repeated not in text, f"{folder}/test.sh repeats {repeated!r} of verifier.sh"
    assert verifiers == 21


def test_a_builtin_task_copied_out_of_the_package_still_gets_its_helper(tmp_path: Path) -> None:
    task = load_task(shutil.copytree(BUILTIN_TASKS / "delete-large-files", tmp_path / "delete-large-files"))
    assert task.test_files(task.steps[0])["tree_check.py"] == TREE_CHECK.read_bytes()
    assert task.test_files(task.steps[0])["verifier.sh"] == VERIFIER_SH.read_bytes()


# --- tree_check.py, run as the verifiers run it ------------------------------------------------------------------

def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check(tmp_path: Path, expected: dict) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copy(TREE_CHECK, tests / "tree_check.py")
    (tests / "expected_tree.json").write_text(json.dumps(expected))
    return subprocess.run([sys.executable, "-I", str(tests / "tree_check.py"), str(tests / "expected_tree.json")],
                          cwd="/", capture_output=True, text=True, timeout=60)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "app" / "notes"
    write_files(root, {"a.md": "alpha\n", "sub/b.txt": b"beta\n"})
    (tmp_path / "app" / "empty").mkdir()
    return root


def expected_of(root: Path) -> dict:
    return {str(root): {"a.md": sha(b"alpha\n"), "sub": "dir", "sub/b.txt": sha(b"beta\n")},
            str(root.parent / "empty"): {}}


def test_tree_check_passes_only_an_exact_match(tmp_path: Path, folder: Path) -> None:
    result = check(tmp_path, expected_of(folder))
    assert (result.returncode, result.stdout) == (0, "PASS\n"), result.stderr


@pytest.mark.parametrize(("change", "fails"), [
    (lambda root: (root / "a.md").write_text("changed\n"), r"a.md: expected [0-9a-f]{64}, found [0-9a-f]{64}"),
    (lambda root: (root / "extra.txt").write_text("x"), r"extra.txt: expected nothing, found"),
    (lambda root: (root / "sub" / "b.txt").unlink(), r"sub/b.txt: expected [0-9a-f]{64}, found nothing"),
    (lambda root: (root.parent / "empty" / "x").mkdir(), r"empty/x: expected nothing, found dir"),
    (lambda root: shutil.rmtree(root), r"notes is missing or not a directory"),
])
def test_tree_check_fails_each_difference(tmp_path: Path, folder: Path, change, fails: str) -> None:
    expected = expected_of(folder)
    change(folder)
    result = check(tmp_path, expected)
    assert result.returncode == 1 and "PASS" not in result.stdout and re.search("FAIL: .*" + fails, result.stdout), \
        result.stdout + result.stderr


def test_tree_check_does_not_follow_links(tmp_path: Path, folder: Path) -> None:
    """A link to a file with the right contents is not that file; a linked root is not the folder."""
    expected = expected_of(folder)
    (tmp_path / "elsewhere.md").write_text("alpha\n")
    (folder / "a.md").unlink()
    os.symlink(tmp_path / "elsewhere.md", folder / "a.md")
    result = check(tmp_path, expected)
    assert result.returncode == 1 and "a.md: expected" in result.stdout and "found other" in result.stdout
    linked = tmp_path / "linked"
    os.symlink(folder, linked)
    result = check(tmp_path, {str(linked): {}})
    assert result.returncode == 1 and "linked is missing or not a directory" in result.stdout


# --- verifier.sh, sourced as the verifiers source it ------------------------------------------------------------

# A verifier of the built-in tasks' shape: the helper first, then small_file (or fail) on the path it is given.
PROBE_TEST_SH = f"""#!/bin/bash
{SOURCE_LINE}
echo "reward=$(cat "$REWARD") cwd=$PWD tests=$(stat -c %a /tests)"
as_agent echo "as_agent ran"
case "$1" in
    fail) fail "told" "to" ;;
    *) small_file "$1" 8 ;;
esac
echo PASS
echo 1 > "$REWARD"
"""


@pytest.mark.parametrize(("arg", "last", "reward"), [
    ("/app/small", "PASS", "1"),  # 8 bytes: the limit itself is allowed
    ("/app/big", "FAIL: /app/big is too large", "0"),
    ("/app/link", "FAIL: /app/link is missing or not a regular file", "0"),
    ("fail", "FAIL: told to", "0"),
])
def test_verifier_sh_starts_at_0_and_fail_and_small_file_stop_the_tests(bwrap_backend: str, tmp_path: Path,
                                                                        arg: str, last: str, reward: str) -> None:
    """Run in bwrap, with the package's verifier.sh as /tests/verifier.sh and folders of tmp_path as /logs and
    /app: the reward is 0 (whatever was there), the tests run in / and close /tests; fail and small_file print
    FAIL and exit 0 with the reward still 0; only a small regular file passes (not a link to one)."""
    tests, logs, app = tmp_path / "tests", tmp_path / "logs", tmp_path / "app"
    write_files(tests, {"test.sh": PROBE_TEST_SH, "verifier.sh": VERIFIER_SH.read_bytes()})
    write_files(logs, {"verifier/reward.txt": "1\n"})  # a stale pass must not survive
    write_files(app, {"small": "12345678", "big": "123456789"})
    (app / "link").symlink_to("small")
    tests.chmod(0o755)
    argv = [*bwrap_base_argv(1000, "verifier"), "--proc", "/proc", "--dev", "/dev", "--bind", str(tests), "/tests",
            "--bind", str(logs), "/logs", "--bind", str(app), "/app", "--", "bash", "/tests/test.sh", arg]
    done = subprocess.run(argv, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["reward=0 cwd=/ tests=700", "as_agent ran", last], done.stderr
    assert (logs / "verifier" / "reward.txt").read_text() == reward + "\n"
