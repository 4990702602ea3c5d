"""A lint for a Harbor task's tests: lines that run what the policy can write.

The policy works in the machine as the agent user and can write the task's work directory
(``[environment] workdir``, else the Dockerfile's ``WORKDIR``, else ``/app``), and any folder the
Dockerfile hands to it (``chown agent``, ``chmod 777``/``o+w``). Then the step's tests run, as root
unless the task says otherwise, and so does the next step's ``setup.sh``. A test that runs, sources
or imports a file the agent can write, or starts Python there without isolation, runs whatever the
policy left there with the tests' privileges, and that code can write the reward. :func:`lint_task`
reads each step's tests (``*.sh`` and ``*.py`` under its tests folders, started in ``/tests`` as
our verifier starts them, unless ``cwd`` says otherwise) and the ``setup.sh`` of every step after
the first (started in the work directory) line by line, and reports such lines:

- ``agent-code``: runs or sources a file the agent can write (``bash /app/run.sh``, ``./run.sh``
  after ``cd /app``, ``python3 /app/main.py``, ``make`` in /app, Python's ``subprocess``/``runpy``/
  ``exec`` on such a file), feeds one to a shell as code (``cat /app/x | bash``, ``bash < /app/x``,
  ``source <(cat /app/x)``, ``eval "$(cat /app/x)"``), runs git in a repository there (its hooks and
  the commands its ``.git/config`` names run), ``pip install``\\s a project there (its ``setup.py``
  runs), reads pytest's settings from there (``-c /app/pytest.ini``: plugins and ``pythonpath``), or
  starts a login shell (``bash -l``, ``su -``, ``sudo -i``) when the files it reads first
  (``/etc/profile.d``, ``/root/.bashrc``) are the agent's: their functions shadow the tests' commands.
- ``agent-path``: puts a folder the agent can write on ``PATH``, ``PYTHONPATH``, ``LD_*``,
  ``BASH_ENV`` or ``sys.path``, or makes it ``HOME``, ``XDG_CONFIG_HOME``, ``PYTHONUSERBASE`` or
  ``GIT_DIR`` (rc files, ``.gitconfig``, a user site-packages ``.pth`` or ``usercustomize.py``).
- ``runs-in-workdir``: ``python -m``/``-c``/stdin without ``-I`` or ``-P``, or ``uv`` (``uv run``,
  ``uv pip``, ...; not ``uvx``), started with the work directory as the current directory: a
  ``pytest.py``, or a ``uv.toml``/``pyproject.toml``, left there takes over.
- ``agent-tests``: pytest or unittest collecting tests from the work directory, whose test files
  and ``conftest.py`` the agent can rewrite.

Running the agent's code is the point of some tasks: a task that declares ``[metadata.skyrl]
tests_run_agent_code = true`` (and drops privileges for that code) gets no ``agent-code`` and
``agent-path`` findings. A line with the comment ``skyrl-lint: ignore`` (optionally followed by
rule ids) is not reported. The rules are line-based heuristics: a path built at run time is not
seen, but reading agent files as data (``cat``, ``diff``, ``open()``) is never reported. The rules
live in :mod:`.lint_rules`; :mod:`.forgeable` decides what a finding
means for training.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .dockerfile import DockerfileError, Instruction, parse_dockerfile
from .lint_context import Context
from .lint_rules import python_file, shell_file

if TYPE_CHECKING:
    from .task_model import HarborTask

DEFAULT_WORKDIR = "/app"
DEFAULT_AGENT_USER = "agent"
TESTS_DIR = "/tests"
DECLARED_RULES = frozenset({"agent-code", "agent-path"})  # not reported where tests_run_agent_code is declared

_IGNORE = re.compile(r"skyrl-lint:\s*ignore\b([\w\s,-]*)")
_WORLD_WRITABLE = re.compile(r"[0-7]?[0-7]{2}[2367]|([ugoa]*[ao][ugoa]*|)[+=][rxXst]*w")
_RUN_SEPARATORS = re.compile(r"&&|\|\||;|\|")


@dataclass(frozen=True)
class LintFinding:
    """One line of a task's tests (or of a later step's setup) that the policy can game."""

    path: str  # POSIX path relative to the task folder
    line: int
    rule: str  # agent-code, agent-path, runs-in-workdir, agent-tests
    message: str  # why a policy can game it, and how to fix it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def lint_task(task: HarborTask, *, cwd: str = TESTS_DIR) -> list[LintFinding]:
    """Findings for every step's test files (each file once) and later steps' ``setup.sh``, in file and line order.

    ``cwd`` is the folder the tests start in: ``/tests`` as our verifier starts them, or the work
    directory as Harbor's does (then relative paths before any ``cd`` are the agent's too).
    """
    workdir = task_workdir(task)
    roots = agent_writable_roots(task)
    declared = task.environment.tests_run_agent_code
    files = dict.fromkeys((path, posixpath.normpath(cwd)) for step in task.steps for folder in step.tests_dirs
                          for path in _script_files(folder))
    files.update(dict.fromkeys((step.setup_script, workdir) for step in task.steps[1:] if step.setup_script))
    findings = []
    for path, start in files:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:  # unreadable: copying it into the machine will fail and say so
            continue
        check = python_file if path.suffix == ".py" else shell_file
        seen: set[tuple[int, str]] = set()
        for number, rule, message in check(lines, Context(workdir, start, roots=roots)):
            if (number, rule) in seen or (declared and rule in DECLARED_RULES) or _ignored(lines[number - 1], rule):
                continue
            seen.add((number, rule))
            findings.append(LintFinding(path.relative_to(task.path).as_posix(), number, rule, message))
    return sorted(findings, key=lambda f: (f.path, f.line, f.rule))


def task_workdir(task: HarborTask) -> str:
    """``[environment] workdir``, else the Dockerfile's last ``WORKDIR``, else ``/app`` (also for ``/``)."""
    environment = task.environment
    workdir = environment.workdir
    if workdir is None and environment.context_dir is not None:
        workdir = _final_stage_workdir(_instructions(task))
    return DEFAULT_WORKDIR if workdir in (None, "/") else workdir.rstrip("/")


def agent_writable_roots(task: HarborTask) -> tuple[str, ...]:
    """Folders beyond the work directory that the task's Dockerfile makes the agent's: ``chown agent PATH`` and
    ``chmod 777 PATH`` (or ``o+w``, ``a+w``) in its final stage's RUN steps (literal absolute paths only)."""
    user = next((step.agent_user for step in task.steps if step.agent_user), DEFAULT_AGENT_USER)
    roots: list[str] = []
    for instruction in _final_stage(_instructions(task)):
        if instruction.keyword != "RUN" or not isinstance(instruction.args, str):
            continue
        for part in _RUN_SEPARATORS.split(instruction.args):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            roots.extend(_granted(words, user))
    return tuple(dict.fromkeys(posixpath.normpath(root) for root in roots if root != "/"))


def _granted(words: list[str], user: str) -> list[str]:
    """The paths a ``chown``/``chmod`` command gives the agent (its owner part, or write for everyone)."""
    words = [word for word in words if not word.startswith("-")]
    if len(words) < 3 or words[0] not in ("chown", "chmod"):
        return []
    grant, paths = words[1], [word for word in words[2:] if word.startswith("/")]
    if words[0] == "chown":
        return paths if re.split(r"[:.]", grant)[0] in (user, "1000") else []
    return paths if any(_WORLD_WRITABLE.fullmatch(mode) for mode in grant.split(",")) else []


def _instructions(task: HarborTask) -> list[Instruction]:
    environment = task.environment
    if environment.context_dir is None:
        return []
    dockerfile = environment.context_dir / environment.dockerfile
    try:
        return parse_dockerfile(dockerfile.read_text(encoding="utf-8"), source=str(dockerfile))
    except (OSError, UnicodeDecodeError, DockerfileError):
        return []


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [index for index, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    return instructions[starts[-1]:] if starts else instructions


def _final_stage_workdir(instructions: list[Instruction]) -> str | None:
    workdir = None
    for instruction in _final_stage(instructions):
        if instruction.keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir or "/", str(instruction.args)))
    return workdir


def _script_files(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix in (".sh", ".py") and path.is_file() and not path.is_symlink():
                yield path


def _ignored(line: str, rule: str) -> bool:
    match = _IGNORE.search(line)
    if match is None:
        return False
    rules = match.group(1).replace(",", " ").split()
    return not rules or rule in rules
