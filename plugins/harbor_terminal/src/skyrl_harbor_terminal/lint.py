"""A lint for a Harbor task's tests: lines that run what the policy can write.

The policy works in the machine as the agent user and can write the task's work directory
(``[environment] workdir``, else the Dockerfile's ``WORKDIR``, else ``/app``). Then the step's tests
run, as root unless the task says otherwise. A test that runs, sources or imports a file from the
work directory, or starts Python there without isolation, runs whatever the policy left there with
the tests' privileges, and that code can write the reward. :func:`lint_task` reads each step's
tests (``*.sh`` and ``*.py`` under its tests folders) line by line and reports such lines (the tests
start in ``/tests``, as our verifier starts them, unless ``cwd`` says otherwise):

- ``agent-code``: runs or sources a file under the work directory (``bash /app/run.sh``,
  ``./run.sh`` after ``cd /app``, ``python3 /app/main.py``, ``make`` in /app, Python's
  ``subprocess``/``runpy``/``exec`` on such a file).
- ``agent-path``: puts the work directory on ``PATH``, ``PYTHONPATH``, ``LD_*`` or ``sys.path``.
- ``runs-in-workdir``: ``python -m``/``-c``/stdin without ``-I`` or ``-P``, or ``uv`` (``uv run``,
  ``uv pip``, ...; not ``uvx``), started with the work directory as the current directory: a
  ``pytest.py``, or a ``uv.toml``/``pyproject.toml``, left there takes over.
- ``agent-tests``: pytest or unittest collecting tests from the work directory, whose test files
  and ``conftest.py`` the agent can rewrite.

Running the agent's code is the point of some tasks: a task that declares ``[metadata.skyrl]
tests_run_agent_code = true`` (and drops privileges for that code) gets no ``agent-code`` and
``agent-path`` findings. A line with the comment ``skyrl-lint: ignore`` (optionally followed by
rule ids) is not reported. The rules are line-based heuristics: a path built at run time is not
seen, but reading agent files as data (``cat``, ``diff``, ``open()``) is never reported.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .dockerfile import DockerfileError, parse_dockerfile

if TYPE_CHECKING:
    from .task_model import HarborTask

DEFAULT_WORKDIR = "/app"
# Options of the test runners whose value is not a path to collect from.
_NON_PATH_VALUE_OPTIONS = {"unittest": frozenset({"-p", "--pattern", "-k"}),
                           "pytest": frozenset({"-k", "-m", "-p", "-o", "-W", "-r", "--tb", "--maxfail", "--durations",
                                                "--junitxml", "--junit-xml", "-n"})}
TESTS_DIR = "/tests"
DECLARED_RULES = frozenset({"agent-code", "agent-path"})  # not reported where tests_run_agent_code is declared

_DECLARE = ("read the agent's files as data instead; or, if running its code is the point, run it as the agent "
            "user (setpriv --reuid=agent --regid=agent --clear-groups) and declare [metadata.skyrl] "
            "tests_run_agent_code = true")
_PRIVILEGES = "with the tests' privileges (root by default), so it can write the reward"

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_INTERPRETERS = frozenset({"node", "perl", "ruby", "php", "Rscript", "lua", "deno", "tclsh"})
_PROJECT_RUNNERS = frozenset({"make", "npm", "npx", "yarn", "pnpm", "cargo", "go", "mvn", "gradle"})
# Commands that run the rest of their arguments: (options that take a value, positional words before the command)
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "timeout": (frozenset({"-k", "--kill-after", "-s", "--signal"}), 1), "env": (frozenset({"-u", "--unset"}), 0),
    "nice": (frozenset({"-n"}), 0), "sudo": (frozenset({"-u", "-g"}), 0), "runuser": (frozenset({"-u", "-g"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e"}), 0), "setpriv": (frozenset(), 0), "nohup": (frozenset(), 0),
    "exec": (frozenset(), 0), "time": (frozenset(), 0),
}
_UV_VALUE_OPTIONS = frozenset({"-w", "--with", "-p", "--python", "--from", "--with-requirements", "--directory",
                               "--project", "--package", "--group", "--extra", "-i", "--index-url", "--index",
                               "--extra-index-url", "-f", "--find-links", "--env-file"})
_PATH_VARIABLES = frozenset({"PATH", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV"})
_KEYWORDS = frozenset({"if", "then", "else", "elif", "while", "until", "do", "!", "{", "}"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_MAX_JOINED_LINES = 200  # a quote left open longer than this is not followed
_INFO_OPTIONS = frozenset({"-V", "--version", "-h", "--help"})  # python --version reads no code
_EVAL_OPTIONS = frozenset({"-e", "-E", "--eval", "-c"})  # node -e CODE, perl -e CODE: no script file
_IGNORE = re.compile(r"skyrl-lint:\s*ignore\b([\w\s,-]*)")

# Python: string literals, and the calls whose literal arguments are code or commands.
_PY_LITERAL = re.compile(r"""[rRbBuUfF]{0,2}(["'])((?:\\.|(?!\1).)*)\1""")
_PY_LIST = re.compile(r"\[([^\[\]]*)\]")
_PY_SYS_PATH = re.compile(r"\bsys\.path\.(?:insert|append|extend)\s*\(|\bsys\.path\s*(?:\[[^\]]*\]\s*)?\+?=|"
                          r"\bsite\.addsitedir\s*\(")
_PY_LOAD = re.compile(r"\b(?:runpy\.run_path|spec_from_file_location|SourceFileLoader|exec|execfile)\s*\(")
_PY_SHELL = re.compile(r"\bos\.(?:system|popen)\s*\(|\bgetoutput\s*\(|\bgetstatusoutput\s*\(|\bshell\s*=\s*True")
_PY_EXEC = re.compile(r"\b(?:subprocess|Popen|check_output|check_call|call|run|spawn\w*|exec\w*|"
                      r"create_subprocess_exec)\s*[.(]")
_PY_CWD = re.compile(r"""\bcwd\s*=\s*[rbu]?["']([^"']+)["']""")
_PY_CHDIR = re.compile(r"""\bchdir\s*\(\s*[rbu]?["']([^"']+)["']""")
_PY_CWD_ON_PATH = re.compile(r"""\(\s*(?:\d+\s*,\s*)?(?:["']\.?["']|os\.getcwd\(\))""")

_Hit = tuple[str, str]  # (rule, message)


@dataclass(frozen=True)
class LintFinding:
    """One line of a task's tests that the policy can game."""

    path: str  # POSIX path relative to the task folder
    line: int
    rule: str  # agent-code, agent-path, runs-in-workdir, agent-tests
    message: str  # why a policy can game it, and how to fix it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def lint_task(task: HarborTask, *, cwd: str = TESTS_DIR) -> list[LintFinding]:
    """Findings for every step's test files (each file once), in file and line order.

    ``cwd`` is the folder the tests start in: ``/tests`` as our verifier starts them, or the work
    directory as Harbor's does (then relative paths before any ``cd`` are the agent's too).
    """
    workdir = task_workdir(task)
    declared = task.environment.tests_run_agent_code
    files = dict.fromkeys(path for step in task.steps for folder in step.tests_dirs for path in _script_files(folder))
    findings = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:  # unreadable: copying it into the machine will fail and say so
            continue
        check = _python_file if path.suffix == ".py" else _shell_file
        seen: set[tuple[int, str]] = set()
        for number, rule, message in check(lines, _Context(workdir, posixpath.normpath(cwd))):
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
        workdir = _dockerfile_workdir(environment.context_dir / environment.dockerfile)
    return DEFAULT_WORKDIR if workdir in (None, "/") else workdir.rstrip("/")


def _dockerfile_workdir(dockerfile: Path) -> str | None:
    try:
        instructions = parse_dockerfile(dockerfile.read_text(encoding="utf-8"), source=str(dockerfile))
    except (OSError, UnicodeDecodeError, DockerfileError):
        return None
    workdir = None
    for instruction in instructions:
        if instruction.keyword == "FROM":  # a new stage starts from its image's folder
            workdir = None
        elif instruction.keyword == "WORKDIR":
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


@dataclass
class _Context:
    """Where a script stands: the work directory, its current directory (None: unknown) and known variables."""

    workdir: str
    cwd: str | None = None
    variables: dict[str, str] = field(default_factory=dict)

    @property
    def in_workdir(self) -> bool:
        return self.cwd is not None and self.inside(self.cwd)

    def inside(self, path: str) -> bool:
        return path == self.workdir or path.startswith(self.workdir + "/")

    def resolve(self, word: str) -> str | None:
        """The absolute path ``word`` names, or None when it is an option, a variable or relative to an unknown cwd."""
        if not word or word[0] in "-$~":
            return None
        if not word.startswith("/"):
            if self.cwd is None:
                return None
            word = posixpath.join(self.cwd, word)
        return posixpath.normpath(word)

    def agent(self, word: str) -> bool:
        path = self.resolve(word)
        return path is not None and self.inside(path)

    def cd(self, target: str | None) -> None:
        self.cwd = self.resolve(target) if target else None

    def expand(self, word: str) -> str:
        return _VARIABLE.sub(lambda m: self.variables.get(m.group(1) or m.group(2), m.group(0)), word)

    def copy(self, cwd: str | None = None) -> _Context:
        """A context for a nested command (``bash -c``, a Python call), so its cd and variables stay in it."""
        return replace(self, cwd=cwd or self.cwd, variables=dict(self.variables))


# ---------------------------------------------------------------- shell


def _shell_file(lines: list[str], context: _Context) -> Iterator[tuple[int, str, str]]:
    index = 0
    while index < len(lines):
        start = index
        text, index = _logical_line(lines, index)
        for rule, message in _shell_line(text, context):
            yield start + 1, rule, message
        heredoc = _HEREDOC.search(text)
        if heredoc is None:
            continue
        feeds_python = any(_PYTHON.fullmatch(os.path.basename(w)) for w in text.split())
        end = heredoc.group(3)
        while index < len(lines) and (lines[index].strip() if heredoc.group(1) else lines[index]) != end:
            if feeds_python:  # the body is Python code
                for rule, message in _python_line(lines[index], context):
                    yield index + 1, rule, message
            index += 1
        index += 1


def _logical_line(lines: list[str], index: int) -> tuple[str, int]:
    """Lines joined across ``\\`` continuations and open quotes; the index after them."""
    text, end = lines[index], index + 1
    quote = _open_quote(text, None)
    while end < len(lines) and end - index < _MAX_JOINED_LINES and (quote or text.endswith("\\")):
        text = text + "\n" + lines[end] if quote else text[:-1] + lines[end]
        quote = _open_quote(lines[end], quote)
        end += 1
    return text, end


def _open_quote(line: str, quote: str | None) -> str | None:
    """The quote character still open at the end of ``line``, given the one open at its start."""
    index = 0
    while index < len(line):
        char = line[index]
        if quote is None and char == "#" and (index == 0 or line[index - 1].isspace()):
            break  # a comment
        if quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
        elif char == "\\" and quote != "'":
            index += 1  # an escaped character
        index += 1
    return quote


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text.replace("`", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _commands(text: str) -> Iterator[list[str]]:
    """The simple commands of a shell line: words split at ``;``, ``&&``, ``|``, ``(`` ...; redirections dropped."""
    try:
        tokens = _tokens(text)
    except ValueError:
        return
    start = depth = 0
    for index, token in enumerate(tokens):
        if _is_operator(token):
            depth += token.count("(") - token.count(")")
        if depth < 0:  # an unmatched ")" ends a case pattern (`a | /app/b) ...`): the words before it are no command
            start, depth = index + 1, 0
    command: list[str] = []
    skip = False
    for token in tokens[start:]:
        if skip:
            skip = False
        elif _is_operator(token):
            if "(" not in token and ")" not in token and ("<" in token or ">" in token):
                skip = True  # the redirection's target
                if command and command[-1].isdigit():
                    command.pop()  # the 2 of 2>/dev/null
                continue
            if command:
                yield command
            command = []
        else:
            command.append(token)
    if command:
        yield command


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in "();<>|&" for c in token)


def _shell_line(text: str, context: _Context) -> Iterator[_Hit]:
    for words in _commands(text):
        words = [context.expand(word) for word in words]
        while words and words[0] in _KEYWORDS:
            words = words[1:]
        yield from _command(words, context)


def _command(words: list[str], context: _Context) -> Iterator[_Hit]:
    """Findings for one simple command; a ``cd`` or an assignment updates ``context``."""
    words = yield from _assignments(words, context)
    while words and words[0] in _WRAPPERS:
        words = yield from _assignments(_unwrap(words), context)  # env NAME=value cmd, sudo -u agent cmd, ...
    if not words:
        return
    program, args = os.path.basename(words[0]), words[1:]
    if program in ("cd", "pushd", "popd"):
        context.cd(next((a for a in args if not a.startswith("-")), None) if program != "popd" else None)
    elif program in ("export", "readonly", "declare", "local"):
        yield from _assignments(args, context)
    elif context.agent(words[0]) and "/" in words[0]:
        yield "agent-code", f"runs {words[0]}, which the agent can write: it runs {_PRIVILEGES}; {_DECLARE}"
    elif program in ("source", ".") and args and context.agent(args[0]):
        yield "agent-code", f"sources {args[0]}, which the agent can write: it runs {_PRIVILEGES}; {_DECLARE}"
    elif program in _SHELLS or program == "su":
        yield from _shell_command(program, args, context)
    elif program in _INTERPRETERS and not _EVAL_OPTIONS & set(args):
        yield from _script(next((a for a in args if not a.startswith("-")), None), program, context)
    elif _PYTHON.fullmatch(program):
        yield from _python_command(args, context)
    elif program in ("pytest", "py.test"):
        yield from _test_runner("pytest", args, context)
    elif program in ("uv", "uvx"):
        yield from _uv(program, args, context)
    elif program in _PROJECT_RUNNERS and (context.in_workdir or any(context.agent(a) for a in args if "/" in a)):
        yield "agent-code", (f"runs {program} on the project in {context.workdir}, so the agent's own build files "
                             f"(Makefile, package.json, build.rs, ...) run {_PRIVILEGES}; {_DECLARE}")


def _assignments(words: list[str], context: _Context) -> Iterator[_Hit]:
    """Record leading ``NAME=value`` words as variables (flagging agent paths on PATH and the like); the rest."""
    while words and (match := _ASSIGNMENT.fullmatch(words[0])):
        name, value = match.groups()
        if "$" in value:
            context.variables.pop(name, None)  # unknown at lint time
        else:
            context.variables[name] = value
        agent = [part for part in value.split(":") if context.agent(part)]
        if name in _PATH_VARIABLES and agent:
            yield "agent-path", (f"puts {agent[0]} on {name}, and the agent can write it: programs, modules or "
                                 f"libraries it leaves there run {_PRIVILEGES}; {_DECLARE}")
        words = words[1:]
    return words


def _unwrap(words: list[str]) -> list[str]:
    """The command a wrapper runs: ``timeout -k 2 10 python3 x.py`` -> ``python3 x.py``."""
    value_options, positionals = _WRAPPERS[words[0]]
    index = 1
    while index < len(words) and words[index].startswith("-"):
        if words[index] == "--":
            index += 1
            break
        index += 2 if words[index] in value_options else 1
    return words[index + positionals:]


def _shell_command(program: str, args: list[str], context: _Context) -> Iterator[_Hit]:
    """``bash -c 'cmd'`` (and ``su user -c 'cmd'``) is read as a line of its own; ``bash file`` runs the file."""
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg and index + 1 < len(args):
            yield from _shell_line(args[index + 1], context.copy())
            return
        if not arg.startswith("-") and program != "su":  # su's first operand is the user
            yield from _script(arg, program, context)
            return


def _script(script: str | None, program: str, context: _Context) -> Iterator[_Hit]:
    if script is not None and context.agent(script):
        yield "agent-code", f"{program} runs {script}, which the agent can write: it runs {_PRIVILEGES}; {_DECLARE}"


def _python_command(args: list[str], context: _Context) -> Iterator[_Hit]:
    """``python [options] (-m module | -c code | script | -) [args]``."""
    isolated = False
    index = 0
    mode, value = "-", None  # stdin, unless a script, -m or -c follows
    while index < len(args):
        arg = args[index]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            if arg != "-":
                index += arg == "--"
                mode, value = ("script", args[index]) if index < len(args) else ("-", None)
            index += 1
            break
        flags = arg[1:] if not arg.startswith("--") else ""
        option = next((i for i, flag in enumerate(flags) if flag in "cmWX"), None)
        head = flags if option is None else flags[:option]  # the rest is the option's value
        isolated = isolated or "I" in head or "P" in head
        if option is None:
            index += 1
            continue
        attached = flags[option + 1:]
        value = attached or (args[index + 1] if index + 1 < len(args) else "")
        index += 1 if attached else 2
        if flags[option] in "cm":
            mode = flags[option]
            break
    rest = args[index:]
    if mode == "script":
        yield from _script(value, "python", context)
        return
    if mode == "-" and _INFO_OPTIONS & set(args):
        return
    if context.in_workdir and not isolated:
        what = {"m": f"python -m {value}", "c": "python -c", "-": "python reading stdin"}[mode]
        module = value if mode == "m" else "json"
        yield "runs-in-workdir", (f"starts {what} in {context.workdir}, which the agent can write: Python puts the "
                                  f"current directory first on sys.path, so a {module}.py the agent leaves there is "
                                  f"imported instead and runs {_PRIVILEGES}; run python -I (or cd /tests first). "
                                  "Our verifier sets PYTHONSAFEPATH=1, which covers this here unless the tests unset "
                                  "it; Harbor's own verifier does not")
    if mode == "c" and value:
        yield from _python_line(value, context)
    if mode == "m" and value in ("pytest", "unittest"):
        yield from _test_runner(value, rest, context)


def _test_runner(runner: str, args: list[str], context: _Context) -> Iterator[_Hit]:
    """pytest or unittest: its path arguments (or, without any, the current directory) are collected."""
    paths, value_follows = [], False
    for arg in args:
        if value_follows:  # a file-name pattern or an expression, not a folder: `-p 'test_*.py'`, `-k name`
            value_follows = False
        elif arg in _NON_PATH_VALUE_OPTIONS[runner]:
            value_follows = True
        elif not arg.startswith("-") and ("/" in arg or arg.endswith(".py") or arg in (".", "..")):
            paths.append(arg)
    agent = [p for p in paths if context.agent(p)]
    if agent or (not paths and context.in_workdir):
        where = agent[0] if agent else f"the current directory ({context.cwd})"
        yield "agent-tests", (f"{runner} collects tests from {where}, where the agent can rewrite the test files and "
                              f"add a conftest.py, so the verdict is its own; keep the tests in /tests and run "
                              f"{runner} on /tests paths from /tests")


def _uv(program: str, args: list[str], context: _Context) -> Iterator[_Hit]:
    """uv reads the settings of the project in the current directory (``uv tool``/``uvx`` excepted);
    ``uv run``, ``uv tool run`` and ``uvx`` then run a command."""
    words = ["tool", "run", *args] if program == "uvx" else args
    command = next((word for word in words if not word.startswith("-")), None)
    if command is None:
        return
    if command != "tool" and context.in_workdir:
        yield "runs-in-workdir", (f"starts uv {command} in {context.workdir}, which the agent can write: uv reads its "
                                  "settings (package index, sources) from uv.toml and pyproject.toml there, and uv "
                                  "run builds and installs the project there, so what the agent left can be installed "
                                  f"and run {_PRIVILEGES}; cd /tests first")
    rest = words[words.index(command) + 1:]
    if command == "tool" and rest[:1] == ["run"]:
        rest = rest[1:]
    elif command != "run":
        return
    index = 0
    while index < len(rest) and rest[index].startswith("-"):
        index += 2 if rest[index] in _UV_VALUE_OPTIONS else 1
    yield from _command(rest[index:], context)


# ---------------------------------------------------------------- python


def _python_file(lines: list[str], context: _Context) -> Iterator[tuple[int, str, str]]:
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("#"):
            continue
        chdir = _PY_CHDIR.search(line)
        if chdir:
            context.cd(chdir.group(1))
        for rule, message in _python_line(line, context):
            yield number, rule, message


def _python_line(line: str, context: _Context) -> Iterator[_Hit]:
    """Python code that imports, loads or runs an agent file (literal paths only)."""
    literals = _literals(line)
    agent = [literal for literal in literals if literal.startswith("/") and context.agent(literal)]
    if _PY_SYS_PATH.search(line) and (agent or (context.in_workdir and _PY_CWD_ON_PATH.search(line))):
        where = agent[0] if agent else f"the current directory ({context.cwd})"
        yield "agent-path", (f"puts {where} on sys.path, and the agent can write it: the modules it leaves there are "
                             f"imported and run {_PRIVILEGES}; {_DECLARE}")
    if _PY_LOAD.search(line) and agent:
        yield "agent-code", f"loads {agent[0]} as Python code, and the agent can write it: it runs {_PRIVILEGES}; {_DECLARE}"
    cwd = _PY_CWD.search(line)  # subprocess.run([...], cwd="/app")
    call_cwd = context.resolve(cwd.group(1)) if cwd else None
    if _PY_SHELL.search(line):
        for literal in literals:
            if " " in literal:
                yield from _shell_line(literal, context.copy(call_cwd))
    exec_call = _PY_EXEC.search(line) is not None
    for match in _PY_LIST.finditer(line):
        argv = _literals(match.group(1))
        if argv and (exec_call or _is_program(argv[0])):
            yield from _command(argv, context.copy(call_cwd))


def _literals(code: str) -> list[str]:
    return [m.group(2) for m in _PY_LITERAL.finditer(code)]


def _is_program(word: str) -> bool:
    name = os.path.basename(word)
    return bool(_PYTHON.fullmatch(name)) or name in _SHELLS | _INTERPRETERS | _PROJECT_RUNNERS | {"pytest", "uv", "uvx"}
