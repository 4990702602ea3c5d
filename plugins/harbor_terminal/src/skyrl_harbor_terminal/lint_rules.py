"""The task lint's rules: a test script read line by line, each simple shell command checked, and Python code (test
files, ``python -c``, heredocs) that imports, loads or runs an agent file (see :mod:`.lint`). One module, since
each kind of code can run the other."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from .lint_context import DECLARE, PRIVILEGES, Context, Hit

PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
INTERPRETERS = frozenset({"node", "perl", "ruby", "php", "Rscript", "lua", "deno", "tclsh"})
PROJECT_RUNNERS = frozenset({"make", "npm", "npx", "yarn", "pnpm", "cargo", "go", "mvn", "gradle", "cmake", "ninja",
                             "meson", "tox", "nox", "rake", "bundle", "poetry", "pdm", "hatch", "just", "pre-commit"})
# Options of the test runners whose value is not a path to collect from.
_NON_PATH_VALUE_OPTIONS = {"unittest": frozenset({"-p", "--pattern", "-k"}),
                           "pytest": frozenset({"-k", "-m", "-p", "-o", "-W", "-r", "--tb", "--maxfail", "--durations",
                                                "--junitxml", "--junit-xml", "-n", "--rootdir", "--confcutdir",
                                                "--basetemp"})}
_PYTEST_CONFIG_OPTIONS = frozenset({"-c", "--config-file", "--inifile"})
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
# Variables naming a folder whose code, modules or settings the programs started after it load and run.
_PATH_VARIABLES = {
    **dict.fromkeys(("PATH", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "PERL5LIB", "RUBYLIB",
                     "NODE_PATH", "GIT_EXEC_PATH", "PYTHONHOME"), "programs, modules or libraries it leaves there"),
    **dict.fromkeys(("HOME", "XDG_CONFIG_HOME", "PYTHONUSERBASE", "GIT_DIR", "GIT_CONFIG_GLOBAL", "PYTHONSTARTUP",
                     "GIT_TEMPLATE_DIR"), "the settings it leaves there (.bashrc, .gitconfig hooks and aliases, "
                                          "a user site-packages .pth or usercustomize.py)"),
}
_KEYWORDS = frozenset({"if", "then", "else", "elif", "while", "until", "do", "!", "{", "}"})
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_MAX_JOINED_LINES = 200  # a quote left open longer than this is not followed
_INFO_OPTIONS = frozenset({"-V", "--version", "-h", "--help"})  # python --version reads no code
_EVAL_OPTIONS = frozenset({"-e", "-E", "--eval", "-c"})  # node -e CODE, perl -e CODE: no script file
# git subcommands that read no repository configuration or hooks of the current folder.
_GIT_SAFE = frozenset({"clone", "init", "version", "help", "config", "--version", "--help", "-h"})
_GIT_VALUE_OPTIONS = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"})
# Files a login or interactive shell of root reads at its start.
_LOGIN_FILES = ("/etc/profile", "/etc/profile.d/skyrl.sh", "/etc/bash.bashrc", "/root/.bashrc", "/root/.profile",
                "/root/.bash_profile")
_PIP = re.compile(r"pip(\d+(\.\d+)?)?")
_PIP_OUTPUT_OPTIONS = frozenset({"-t", "--target", "--prefix", "--root", "-d", "--dest", "--log", "--cache-dir",
                                 "--report", "-w", "--wheel-dir", "--src"})


@dataclass(frozen=True)
class Command:
    """One simple command of a line: its words, the file its stdin is redirected from, whether a pipe feeds it, and
    the words of the command that reads its output when it is a substitution (``<(cmd)``, ``$(cmd)``)."""

    words: list[str]
    stdin: str | None = None
    piped: bool = False
    reader: list[str] | None = None


def shell_file(lines: list[str], context: Context) -> Iterator[tuple[int, str, str]]:
    index = 0
    while index < len(lines):
        start = index
        text, index = _logical_line(lines, index)
        for rule, message in shell_line(text, context):
            yield start + 1, rule, message
        heredoc = HEREDOC.search(text)
        if heredoc is None:
            continue
        feeds_python = any(PYTHON.fullmatch(os.path.basename(w)) for w in text.split())
        end = heredoc.group(3)
        while index < len(lines) and (lines[index].strip() if heredoc.group(1) else lines[index]) != end:
            if feeds_python:  # the body is Python code
                for rule, message in python_line(lines[index], context):
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


def commands(text: str) -> Iterator[Command]:
    """The simple commands of a shell line: words split at ``;``, ``&&``, ``|``, ``(`` ...; redirections dropped
    (but where stdin comes from is kept), process substitutions (``<(cmd)``) marked as piped into their reader."""
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
    words: list[str] = []
    stdin: str | None = None
    piped = target = False
    reader: list[str] | None = None
    for token in tokens[start:]:
        if target:
            target = False
            if stdin == "":
                stdin = token
        elif _is_operator(token):
            if "(" not in token and ")" not in token and ("<" in token or ">" in token):
                target = True  # the redirection's target
                if token in ("<", "0<"):
                    stdin = ""
                if words and words[-1].isdigit():
                    words.pop()  # the 2 of 2>/dev/null
                continue
            substitution = token.endswith("<(") or (token.startswith("(") and bool(words) and words[-1].endswith("$"))
            if substitution and not token.endswith("<("):
                words[-1] = words[-1][:-1]
                words = [word for word in words if word]
            if words:
                yield Command(words, stdin or None, piped, reader)
            piped = token in ("|", "|&")
            reader = list(words) if substitution else None
            words, stdin = [], None
        else:
            words.append(token)
    if words:
        yield Command(words, stdin or None, piped, reader)


def _is_operator(token: str) -> bool:
    return bool(token) and all(c in "();<>|&" for c in token)


def shell_line(text: str, context: Context) -> Iterator[Hit]:
    feeder: str | None = None  # the agent file the previous command of a pipe reads
    for command in commands(text):
        words = [context.expand(word) for word in command.words]
        while words and words[0] in _KEYWORDS:
            words = words[1:]
        reads = next((word for word in words[1:] if "://" not in word and context.agent(word)), None)
        if command.reader is not None and reads is not None and _runs_its_input(command.reader, operand=False):
            reader = os.path.basename(command.reader[0]) if command.reader else "the shell"
            yield "agent-code", (f"gives what it reads from {reads}, which the agent can write, to {reader} as code: it "
                                 f"runs {PRIVILEGES}; {DECLARE}")
        source = command.stdin if command.stdin and context.agent(context.expand(command.stdin)) else None
        source = source or (feeder if command.piped else None)
        if source is not None and _runs_its_input(words, operand=True):
            yield "agent-code", (f"feeds {source}, which the agent can write, to {os.path.basename(words[0])} as "
                                 f"code: it runs {PRIVILEGES}; {DECLARE}")
        feeder = reads
        yield from command_hits(words, context)


def _runs_its_input(words: list[str], operand: bool) -> bool:
    """Whether ``words`` run the text given to them: on stdin (``bash``, ``sh -s``, ``python3 -``, ``source
    /dev/stdin``), or with ``operand=False`` as a file operand still to come (``source <(...)``, ``eval $(...)``,
    a ``$(...)`` that is itself the command)."""
    while words and words[0] in _WRAPPERS:
        words = _unwrap(words)
    if not words:
        return not operand
    program, args = os.path.basename(words[0]), words[1:]
    operands = [arg for arg in args if not arg.startswith("-") or arg == "-"]
    if program == "eval":
        return not operand
    if program in ("source", "."):
        return not args if not operand else args[:1] in (["/dev/stdin"], ["/dev/fd/0"], ["/proc/self/fd/0"])
    if program in SHELLS or PYTHON.fullmatch(program) or program in INTERPRETERS:
        return not operands or (operand and (operands[0] in ("-", "/dev/stdin") or "-s" in args))
    return operand and program == "xargs" and bool(operands) and os.path.basename(operands[0]) in SHELLS


def command_hits(words: list[str], context: Context) -> Iterator[Hit]:
    """Findings for one simple command; a ``cd`` or an assignment updates ``context``."""
    words = yield from _assignments(words, context)
    while words and words[0] in _WRAPPERS:
        if words[0] in ("sudo", "runuser") and ("-i" in words or "-l" in words) and _login_user(words) == "root":
            yield from _login_shell(words[0], context)
        words = yield from _assignments(_unwrap(words), context)  # env NAME=value cmd, sudo -u agent cmd, ...
    if not words:
        return
    program, args = os.path.basename(words[0]), words[1:]
    if program in ("cd", "pushd", "popd"):
        context.cd(next((a for a in args if not a.startswith("-")), None) if program != "popd" else None)
    elif program in ("export", "readonly", "declare", "local", "typeset"):
        yield from _assignments(args, context)
    elif context.agent(words[0]) and "/" in words[0]:
        yield "agent-code", f"runs {words[0]}, which the agent can write: it runs {PRIVILEGES}; {DECLARE}"
    elif program in ("source", ".") and args and context.agent(args[0]):
        yield "agent-code", (f"sources {args[0]}, which the agent can write: its commands, and the functions it "
                             f"defines in place of the commands the tests call, run {PRIVILEGES}; {DECLARE}")
    elif program == "eval":
        yield from _eval(args, context)
    elif program in SHELLS or program == "su":
        yield from _shell_command(program, args, context)
    elif program in INTERPRETERS and not _EVAL_OPTIONS & set(args):
        yield from script(next((a for a in args if not a.startswith("-")), None), program, context)
    elif PYTHON.fullmatch(program):
        yield from _python_command(args, context)
    elif program in ("pytest", "py.test"):
        yield from _test_runner("pytest", args, context)
    elif program in ("uv", "uvx"):
        yield from _uv(program, args, context)
    elif _PIP.fullmatch(program):
        yield from _pip(args, context)
    elif program == "git":
        yield from _git(args, context)
    elif program in PROJECT_RUNNERS and (context.in_workdir or any(context.agent(a) for a in args if "/" in a)):
        yield "agent-code", (f"runs {program} on the project in {context.workdir}, so the agent's own build files "
                             f"(Makefile, package.json, build.rs, ...) run {PRIVILEGES}; {DECLARE}")


def _assignments(words: list[str], context: Context) -> Iterator[Hit]:
    """Record leading ``NAME=value`` words as variables (flagging agent paths on PATH and the like); the rest."""
    while words and (match := _ASSIGNMENT.fullmatch(words[0])):
        name, value = match.groups()
        if "$" in value:
            context.variables.pop(name, None)  # unknown at lint time
        else:
            context.variables[name] = value
        agent = [part for part in value.split(":") if context.agent(part)]
        if name in _PATH_VARIABLES and agent:
            yield "agent-path", (f"puts {agent[0]} in {name}, and the agent can write it: {_PATH_VARIABLES[name]} "
                                 f"run {PRIVILEGES}; {DECLARE}")
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


def _eval(args: list[str], context: Context) -> Iterator[Hit]:
    """``eval "bash /app/x"`` is read as a line; ``eval "$(cat /app/cmd)"`` runs what the agent wrote."""
    text = " ".join(args)
    read = next((word for command in commands(text.replace("$(", " ( ")) for word in command.words[1:]
                 if context.agent(word)), None)
    if read is not None:
        yield "agent-code", f"evaluates text read from {read}, which the agent can write: it runs {PRIVILEGES}; " \
                            f"{DECLARE}"
    else:
        yield from shell_line(text, context.copy())


def _shell_command(program: str, args: list[str], context: Context) -> Iterator[Hit]:
    """``bash -c 'cmd'`` (and ``su user -c 'cmd'``) is read as a line of its own; ``bash file`` runs the file;
    ``bash -l``, ``bash -i`` and ``su -`` read the login files first."""
    login = any(arg in ("-", "--login") or (arg.startswith("-") and not arg.startswith("--") and
                                            ("l" in arg or "i" in arg)) for arg in args)
    if login and (program != "su" or _login_user([program, *args]) == "root"):
        yield from _login_shell(program, context)
    for index, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg and index + 1 < len(args):
            yield from shell_line(args[index + 1], context.copy())
            return
        if not arg.startswith("-") and program != "su":  # su's first operand is the user
            yield from script(arg, program, context)
            return


def _login_user(words: list[str]) -> str:
    """The user a ``su``, ``sudo`` or ``runuser`` command becomes: its -u value, else its first operand, else root."""
    args = words[1:]
    if "-u" in args[:-1]:
        return args[args.index("-u") + 1]
    operands = [arg for arg in args if not arg.startswith("-")]
    return operands[0] if operands and words[0] != "sudo" else "root"


def _login_shell(program: str, context: Context) -> Iterator[Hit]:
    writable = next((path for path in _LOGIN_FILES if context.agent(path)), None)
    if writable is not None:
        yield "agent-code", (f"starts a login or interactive shell ({program}), which reads "
                             f"{writable.replace('/skyrl.sh', '/*.sh')} at its start, and the agent can write it: "
                             f"its commands, and functions shadowing the commands the tests call, run {PRIVILEGES}; "
                             "start a plain, non-login shell (bash script.sh)")


def script(path: str | None, program: str, context: Context) -> Iterator[Hit]:
    if path is not None and context.agent(path):
        yield "agent-code", f"{program} runs {path}, which the agent can write: it runs {PRIVILEGES}; {DECLARE}"


def _python_command(args: list[str], context: Context) -> Iterator[Hit]:
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
        yield from script(value, "python", context)
        return
    if mode == "-" and _INFO_OPTIONS & set(args):
        return
    if context.in_workdir and not isolated:
        what = {"m": f"python -m {value}", "c": "python -c", "-": "python reading stdin"}[mode]
        module = value if mode == "m" else "json"
        yield "runs-in-workdir", (f"starts {what} in {context.workdir}, which the agent can write: Python puts the "
                                  f"current directory first on sys.path, so a {module}.py the agent leaves there is "
                                  f"imported instead and runs {PRIVILEGES}; run python -I (or cd /tests first). "
                                  "Our verifier sets PYTHONSAFEPATH=1, which covers this here unless the tests unset "
                                  "it; Harbor's own verifier does not")
    if mode == "c" and value:
        yield from python_line(value, context)
    if mode == "m" and value in ("pytest", "unittest"):
        yield from _test_runner(value, rest, context)
    elif mode == "m" and value == "pip":
        yield from _pip(rest, context)


def _test_runner(runner: str, args: list[str], context: Context) -> Iterator[Hit]:
    """pytest or unittest: its path arguments (or, without any, the current directory) are collected."""
    paths, value_follows = [], False
    for index, arg in enumerate(args):
        option, _, attached = arg.partition("=")
        if value_follows:  # a file-name pattern or an expression, not a folder: `-p 'test_*.py'`, `-k name`
            value_follows = False
        elif runner == "pytest" and option in _PYTEST_CONFIG_OPTIONS:
            config = attached or (args[index + 1] if index + 1 < len(args) else "")
            value_follows = not attached
            if context.agent(config):
                yield "agent-code", (f"pytest reads its settings from {config}, which the agent can write: its "
                                     "addopts and pythonpath load the agent's plugins and conftest.py, which run "
                                     f"{PRIVILEGES}; keep the settings in /tests")
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


def _pip(args: list[str], context: Context) -> Iterator[Hit]:
    """``pip install /app``, ``-e .`` in /app or ``-r /app/requirements.txt``: the agent's build code runs."""
    if not args or args[0] not in ("install", "wheel", "download"):
        return
    agent, skip = None, False
    for arg in args[1:]:
        option, _, attached = arg.partition("=")
        if skip or option in _PIP_OUTPUT_OPTIONS:  # where pip writes, not what it reads
            skip = not skip and not attached and option in _PIP_OUTPUT_OPTIONS
            continue
        path = attached or arg
        if ("/" in path or path in (".", "..")) and "://" not in path and context.agent(path):
            agent = path
            break
    if agent is not None:
        yield "agent-code", (f"pip {args[0]} reads {agent}, which the agent can write: the setup.py or build backend "
                             f"of a project there (or a requirement it names) runs {PRIVILEGES}; {DECLARE}")


def _git(args: list[str], context: Context) -> Iterator[Hit]:
    """git in a repository the agent can write runs its hooks and the commands its config names."""
    repo: str | None = context.cwd
    index = 0
    while index < len(args) and args[index].startswith("-"):
        option, _, attached = args[index].partition("=")
        value = attached or (args[index + 1] if index + 1 < len(args) else "")
        if option == "-C":
            base = posixpath.join(repo, value) if repo else value
            repo = posixpath.normpath(base) if base.startswith("/") and "$" not in base else None
        elif option in ("--git-dir", "--work-tree"):
            repo = context.resolve(value)
        elif option in _GIT_SAFE:
            return
        index += 1 if attached or option not in _GIT_VALUE_OPTIONS else 2
    command = args[index] if index < len(args) else None
    git_dir = context.variables.get("GIT_DIR")
    repo = git_dir if git_dir and repo == context.cwd else repo
    if command is None or command in _GIT_SAFE or repo is None or not context.inside(repo):
        return
    yield "agent-code", (f"runs git {command} in {repo}, a repository the agent can write: its hooks (.git/hooks, "
                         "core.hooksPath) and the commands its .git/config names (core.fsmonitor, core.pager, aliases, "
                         f"filters) run {PRIVILEGES}; copy its objects and refs into a fresh repository and read them "
                         "with git --git-dir there, or run git as the agent user")


def _uv(program: str, args: list[str], context: Context) -> Iterator[Hit]:
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
                                  f"and run {PRIVILEGES}; cd /tests first")
    rest = words[words.index(command) + 1:]
    if command == "tool" and rest[:1] == ["run"]:
        rest = rest[1:]
    elif command == "pip":
        yield from _pip(rest, context)
        return
    elif command != "run":
        return
    index = 0
    while index < len(rest) and rest[index].startswith("-"):
        index += 2 if rest[index] in _UV_VALUE_OPTIONS else 1
    yield from command_hits(rest[index:], context)


# -- Python -----------------------------------------------------------------------------------------------------

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
_PY_ENVIRON = re.compile(r"""\benviron\s*\[\s*["']([A-Z_][A-Z0-9_]*)["']\s*\]\s*=|\benv\s*=\s*\{""")


def python_file(lines: list[str], context: Context) -> Iterator[tuple[int, str, str]]:
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("#"):
            continue
        chdir = _PY_CHDIR.search(line)
        if chdir:
            context.cd(chdir.group(1))
        for rule, message in python_line(line, context):
            yield number, rule, message


def python_line(line: str, context: Context) -> Iterator[Hit]:
    """Python code that imports, loads or runs an agent file (literal paths only)."""
    literals = _literals(line)
    agent = [literal for literal in literals if literal.startswith("/") and context.agent(literal)]
    if _PY_SYS_PATH.search(line) and (agent or (context.in_workdir and _PY_CWD_ON_PATH.search(line))):
        where = agent[0] if agent else f"the current directory ({context.cwd})"
        yield "agent-path", (f"puts {where} on sys.path, and the agent can write it: the modules, .pth files and "
                             f"sitecustomize.py it leaves there are imported and run {PRIVILEGES}; {DECLARE}")
    if _PY_LOAD.search(line) and agent:
        yield "agent-code", f"loads {agent[0]} as Python code, and the agent can write it: it runs {PRIVILEGES}; {DECLARE}"
    environ = _PY_ENVIRON.search(line)
    if environ and agent:  # os.environ["HOME"] = "/app", env={"PYTHONPATH": "/app"}: as NAME=value in a shell
        for name, value in re.findall(r"""["']([A-Z_][A-Z0-9_]*)["']\s*[:\]]\s*=?\s*["']([^"']*)["']""", line):
            yield from command_hits([f"{name}={value}"], context.copy())
    cwd = _PY_CWD.search(line)  # subprocess.run([...], cwd="/app")
    call_cwd = context.resolve(cwd.group(1)) if cwd else None
    if _PY_SHELL.search(line):
        for literal in literals:
            if " " in literal:
                yield from shell_line(literal, context.copy(call_cwd))
    exec_call = _PY_EXEC.search(line) is not None
    for match in _PY_LIST.finditer(line):
        argv = _literals(match.group(1))
        if argv and (exec_call or _is_program(argv[0])):
            yield from command_hits(argv, context.copy(call_cwd))


def _literals(code: str) -> list[str]:
    return [m.group(2) for m in _PY_LITERAL.finditer(code)]


def _is_program(word: str) -> bool:
    name = os.path.basename(word)
    return bool(PYTHON.fullmatch(name)) or name in (SHELLS | INTERPRETERS |
                                                              PROJECT_RUNNERS | {"pytest", "uv", "uvx", "git"})
