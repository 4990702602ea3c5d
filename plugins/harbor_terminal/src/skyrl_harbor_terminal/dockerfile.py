"""A small Dockerfile reader for the bwrap backend, which runs a task without Docker.

The bwrap backend can reproduce a Dockerfile only when it starts ``FROM`` the terminal base image
and then copies files and runs shell commands. :func:`parse_dockerfile` reads the text (comments,
``\\`` continuations, exec and shell forms, ``ARG``/``ENV`` substitution as Docker does it);
:func:`plan_for_bwrap` turns the instructions into a :class:`BwrapRecipe`, or says with the line
number why the file needs Docker. Multi-stage builds and heredocs are refused while parsing.

What :func:`plan_for_bwrap` does with each instruction:

- ``FROM``: must name exactly the base image; ``ARG``, ``ENV``, ``WORKDIR``, ``USER``: tracked;
- ``RUN``: a :class:`RunStep` with the workdir, environment and user in effect at that line;
- ``COPY``/``ADD``: a :class:`CopyStep` per source; ``--chown``/``--chmod`` kept, ``--link`` ignored;
  ``COPY --from``, other flags, ``ADD`` of a URL or of an archive (by file name), and sources
  outside the build context are errors;
- ``RUN`` flags (``--mount``, ``--network``, ...) and ``SHELL``: errors;
- ``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``, ``MAINTAINER``, ``HEALTHCHECK``, ``STOPSIGNAL``,
  ``VOLUME``, ``ONBUILD``: ignored, since the task container's command, ports and metadata are
  the harness's business and none of them changes the file system.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

KEYWORDS = frozenset({"FROM", "RUN", "CMD", "ENTRYPOINT", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER",
                      "EXPOSE", "LABEL", "MAINTAINER", "HEALTHCHECK", "SHELL", "VOLUME", "STOPSIGNAL",
                      "ONBUILD"})
IGNORED = frozenset({"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL",
                     "VOLUME", "ONBUILD"})
_EXEC_FORM = frozenset({"RUN", "CMD", "ENTRYPOINT", "COPY", "ADD", "SHELL"})
_WITH_FLAGS = frozenset({"FROM", "RUN", "COPY", "ADD"})
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VARIABLE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])(.*))?", re.DOTALL)
_HEREDOC_RE = re.compile(r"(?<!<)<<-?([\"']?)[A-Za-z_][A-Za-z0-9_]*\1")
_DIRECTIVE_RE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(.*?)\s*")
_ENV_PAIR_RE = re.compile(r"[^\s=]+=")
_CHMOD_RE = re.compile(r"[0-7]{3,4}")
_ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tbz2", ".tar.xz", ".txz", ".tar.zst",
                     ".gz", ".bz2", ".xz", ".zst")
UNSUPPORTED = "not supported by the bwrap backend"


class DockerfileError(ValueError):
    """A Dockerfile that cannot be read, or that the bwrap backend cannot reproduce; names the line."""


@dataclass(frozen=True)
class Instruction:
    """One instruction; ``args`` is a list in exec form and for COPY/ADD/ENV/ARG, else the text."""

    keyword: str
    args: list[str] | str
    line: int
    form: str = "shell"  # "exec" for a JSON array
    flags: dict[str, str] = field(default_factory=dict)  # --name=value options (a bare --name gives "")


@dataclass(frozen=True)
class CopyStep:
    """Docker's COPY rules apply: a folder source copies its contents into ``dest``."""

    src: str  # relative to the build context, may hold glob patterns; "." is the whole context
    dest: str  # absolute; ends with "/" when it names a folder
    chmod: str | None = None  # octal digits
    chown: str | None = None


@dataclass(frozen=True)
class RunStep:
    command: str  # for /bin/sh -c
    workdir: str  # to be created if missing, as Docker's WORKDIR does
    env: dict[str, str]  # ARG and ENV values in effect (ENV wins), on top of the base image's
    user: str | None  # None: the base image's default (root)


@dataclass(frozen=True)
class BwrapRecipe:
    """What to do, in order, on top of the base image; ``workdir``, ``env`` and ``user`` are final."""

    workdir: str
    env: dict[str, str]
    user: str | None
    steps: tuple[CopyStep | RunStep, ...]

    @property
    def copies(self) -> list[tuple[str, str, str | None]]:
        """(source, absolute destination, chmod) of each copy; see :attr:`steps` for the order."""
        return [(step.src, step.dest, step.chmod) for step in self.steps if isinstance(step, CopyStep)]

    @property
    def runs(self) -> list[str]:
        """The shell command of each RUN; see :attr:`steps` for their context and order."""
        return [step.command for step in self.steps if isinstance(step, RunStep)]


def parse_dockerfile(text: str, *, source: str = "Dockerfile",
                     base_env: Mapping[str, str] | None = None) -> list[Instruction]:
    """The instructions of ``text``, with ARG/ENV values substituted in COPY, ADD, ENV, ARG, WORKDIR, USER.

    ``base_env`` is the base image's environment, so that ``ENV PATH=/opt/bin:$PATH`` extends its PATH
    (without it, an unknown variable is empty, as in Docker).
    """
    scope = _Scope(env=dict(base_env or {}))
    instructions = []
    for line, logical in _logical_lines(text, source):
        keyword, rest = _split_word(logical)
        keyword = keyword.upper()
        where = f"{source}:{line}"
        if keyword not in KEYWORDS:
            raise DockerfileError(f"{where}: unknown instruction {keyword}")
        instructions.append(_parse_instruction(keyword, rest, line, where, scope))
    return instructions


def plan_for_bwrap(instructions: list[Instruction], base_image: str, *, source: str = "Dockerfile") -> BwrapRecipe:
    """The copies and commands that rebuild the image on ``base_image``; DockerfileError when it needs Docker."""
    plan = _Plan(base_image)
    for instruction in instructions:
        where = f"{source}:{instruction.line}"
        if plan.from_seen or instruction.keyword == "ARG":
            _PLANNERS[instruction.keyword](plan, instruction, where)
        elif instruction.keyword == "FROM":
            _plan_from(plan, instruction, where)
        else:
            raise DockerfileError(f"{where}: {instruction.keyword} comes before FROM")
    if not plan.from_seen:
        raise DockerfileError(f"{source}: has no FROM instruction")
    return BwrapRecipe(workdir=plan.workdir, env=dict(plan.env), user=plan.user, steps=tuple(plan.steps))


# ---------------------------------------------------------------- reading


@dataclass
class _Scope:
    """ARG and ENV values in effect while parsing; ARGs before FROM are visible only to FROM."""

    global_args: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    from_seen: bool = False

    def variables(self) -> dict[str, str]:
        return {**(self.args if self.from_seen else self.global_args), **self.env}


def _logical_lines(text: str, source: str) -> list[tuple[int, str]]:
    """(first line number, joined text) per instruction: comments and blank lines dropped, ``\\`` joined."""
    lines = text.splitlines()
    _check_directives(lines, source)
    result: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        start = start or number
        body = raw.rstrip()
        if body.endswith("\\"):
            parts.append(body[:-1])
            continue
        parts.append(body)
        result.append((start, "".join(parts).strip()))
        parts, start = [], 0
    if parts and "".join(parts).strip():
        result.append((start, "".join(parts).strip()))
    return result


def _check_directives(lines: list[str], source: str) -> None:
    """Parser directives open the file; only the default escape character is supported."""
    for number, raw in enumerate(lines, start=1):
        match = _DIRECTIVE_RE.fullmatch(raw.strip())
        if not match:
            return
        if match.group(1).lower() == "escape" and match.group(2) != "\\":
            raise DockerfileError(f"{source}:{number}: escape={match.group(2)} is {UNSUPPORTED}")


def _parse_instruction(keyword: str, rest: str, line: int, where: str, scope: _Scope) -> Instruction:
    if keyword in ("RUN", "COPY", "ADD") and _HEREDOC_RE.search(rest):
        raise DockerfileError(f"{where}: heredocs (<<EOF) are {UNSUPPORTED}")
    flags: dict[str, str] = {}
    if keyword in _WITH_FLAGS:
        flags, rest = _split_flags(rest, scope.variables(), where)
    if not rest:
        raise DockerfileError(f"{where}: {keyword} needs arguments")
    exec_args = _json_array(rest) if keyword in _EXEC_FORM else None
    if keyword == "FROM":
        return Instruction(keyword, _parse_from(rest, where, scope), line, flags=flags)
    if keyword in ("COPY", "ADD"):
        return _parse_copy(keyword, rest, exec_args, line, where, scope, flags)
    if exec_args is not None:
        return Instruction(keyword, exec_args, line, "exec", flags)
    if keyword == "ENV":
        return Instruction(keyword, _parse_env(rest, where, scope), line)
    if keyword == "ARG":
        return Instruction(keyword, _parse_arg(rest, where, scope), line)
    if keyword in ("WORKDIR", "USER"):
        return Instruction(keyword, _single_word(rest, scope.variables(), where, keyword), line)
    return Instruction(keyword, rest, line, flags=flags)


def _split_word(text: str) -> tuple[str, str]:
    """The first whitespace-separated word of ``text`` and the rest, stripped."""
    word, *rest = text.split(None, 1)
    return word, rest[0].strip() if rest else ""


def _split_flags(rest: str, variables: Mapping[str, str], where: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        token, rest = _split_word(rest)
        name, _, value = token[2:].partition("=")
        flags[name] = _single_word(value, variables, where, f"--{name}") if value else ""
    return flags, rest


def _json_array(rest: str) -> list[str] | None:
    """The exec form's list, or None when ``rest`` is not a JSON array of strings (shell form, as Docker)."""
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def _parse_from(rest: str, where: str, scope: _Scope) -> str:
    words = _expand(rest, scope.variables(), where)
    if scope.from_seen or (len(words) == 3 and words[1].upper() == "AS"):
        raise DockerfileError(f"{where}: multi-stage builds are {UNSUPPORTED}")
    if len(words) != 1:
        raise DockerfileError(f"{where}: FROM takes one image, got {rest!r}")
    scope.from_seen = True
    return words[0]


def _parse_copy(keyword: str, rest: str, exec_args: list[str] | None, line: int, where: str,
                scope: _Scope, flags: dict[str, str]) -> Instruction:
    variables = scope.variables()
    if exec_args is not None:
        args = ["".join(_expand(item, variables, where, split=False, quotes=False)) for item in exec_args]
    else:
        args = _expand(rest, variables, where)
    if len(args) < 2:
        raise DockerfileError(f"{where}: {keyword} needs a source and a destination")
    return Instruction(keyword, args, line, "shell" if exec_args is None else "exec", flags)


def _parse_env(rest: str, where: str, scope: _Scope) -> list[str]:
    """``ENV A=b C="d e"``, or the legacy ``ENV A b c`` (one variable, the rest of the line its value)."""
    variables = scope.variables()
    if _ENV_PAIR_RE.match(rest):
        pairs = [word.partition("=") for word in _expand(rest, variables, where)]
        if any(not sep or not name for name, sep, _ in pairs):
            raise DockerfileError(f"{where}: ENV expects NAME=value pairs, got {rest!r}")
    else:
        name, value = _split_word(rest)
        if not value:
            raise DockerfileError(f"{where}: ENV {name} has no value")
        pairs = [(name, "=", _single_word(value, variables, where, "ENV"))]
    scope.env.update((name, value) for name, _, value in pairs)
    return [f"{name}={value}" for name, _, value in pairs]


def _parse_arg(rest: str, where: str, scope: _Scope) -> list[str]:
    """``ARG NAME[=default] ...``; a bare name after FROM takes the value of the same ARG before FROM."""
    result = []
    for word in _expand(rest, scope.variables(), where):
        name, sep, value = word.partition("=")
        if not _NAME_RE.fullmatch(name):
            raise DockerfileError(f"{where}: ARG name {name!r} is not valid")
        target = scope.args if scope.from_seen else scope.global_args
        if not sep and scope.from_seen and name in scope.global_args:
            sep, value = "=", scope.global_args[name]
        if sep:
            target[name] = value
        result.append(f"{name}{sep}{value}")
    return result


def _single_word(text: str, variables: Mapping[str, str], where: str, what: str) -> str:
    words = _expand(text, variables, where, split=False)
    if not words or not words[0]:
        raise DockerfileError(f"{where}: {what} is empty")
    return words[0]


def _expand(text: str, variables: Mapping[str, str], where: str, *,
            split: bool = True, quotes: bool = True) -> list[str]:
    """Docker's word processing: quotes, backslash escapes, ``$VAR``/``${VAR}``; words split on spaces."""
    words: list[str] = []
    current: list[str] = []
    in_word = False
    index = 0
    while index < len(text):
        char = text[index]
        if split and char.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
            index += 1
            continue
        in_word = True
        if quotes and char == "'":
            end = text.find("'", index + 1)
            if end < 0:
                raise DockerfileError(f"{where}: unterminated single quote")
            current.append(text[index + 1:end])
            index = end + 1
        elif quotes and char == '"':
            index = _double_quoted(text, index + 1, variables, current, where)
        else:
            index = _plain_char(text, index, variables, current, where, None if quotes else "$")
    if in_word:
        words.append("".join(current))
    return words


def _double_quoted(text: str, index: int, variables: Mapping[str, str], current: list[str], where: str) -> int:
    """Append the inside of a double-quoted string starting at ``index``; the index after its closing quote."""
    while index < len(text):
        char = text[index]
        if char == '"':
            return index + 1
        index = _plain_char(text, index, variables, current, where, '"\\$')
    raise DockerfileError(f"{where}: unterminated double quote")


def _plain_char(text: str, index: int, variables: Mapping[str, str], current: list[str], where: str,
                escapable: str | None) -> int:
    """Append what the character at ``index`` stands for (a backslash escapes ``escapable``, None: any
    character; ``$`` starts a variable); the index after it."""
    char = text[index]
    if char == "\\" and index + 1 < len(text) and (escapable is None or text[index + 1] in escapable):
        current.append(text[index + 1])
        return index + 2
    if char == "$":
        value, index = _variable(text, index, variables, where)
        current.append(value)
        return index
    current.append(char)
    return index + 1


def _variable(text: str, index: int, variables: Mapping[str, str], where: str) -> tuple[str, int]:
    """The value of the ``$NAME``, ``${NAME}`` or ``${NAME:-word}`` (``:+``, ``-``, ``+``) at ``index``."""
    if not text.startswith("{", index + 1):
        match = _NAME_RE.match(text, index + 1)
        return (variables.get(match.group(), ""), match.end()) if match else ("$", index + 1)
    end = _closing_brace(text, index + 2, where)
    match = _VARIABLE_RE.fullmatch(text[index + 2:end])
    if not match:
        raise DockerfileError(f"{where}: ${{{text[index + 2:end]}}} is {UNSUPPORTED}")
    name, operator, word = match.groups()
    value = variables.get(name)
    if operator is None:
        return value or "", end + 1
    alternative = "".join(_expand(word, variables, where, split=False, quotes=False))
    is_set = bool(value) if operator.startswith(":") else value is not None
    if operator.endswith("-"):
        return (value if is_set else alternative) or "", end + 1
    return (alternative if is_set else ""), end + 1


def _closing_brace(text: str, index: int, where: str) -> int:
    depth = 1
    while index < len(text):
        if text.startswith("${", index):
            depth += 1
            index += 2
            continue
        if text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise DockerfileError(f"{where}: unterminated ${{...}}")


# ---------------------------------------------------------------- planning


@dataclass
class _Plan:
    base_image: str
    from_seen: bool = False
    workdir: str = "/"
    user: str | None = None
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    steps: list[CopyStep | RunStep] = field(default_factory=list)


def _plan_from(plan: _Plan, instruction: Instruction, where: str) -> None:
    if instruction.flags:
        raise DockerfileError(f"{where}: FROM --{next(iter(instruction.flags))} is {UNSUPPORTED}")
    if instruction.args != plan.base_image:
        raise DockerfileError(f"{where}: needs Docker: FROM {instruction.args} "
                              f"(the bwrap backend runs only FROM {plan.base_image})")
    plan.from_seen = True


def _plan_arg(plan: _Plan, instruction: Instruction, where: str) -> None:
    """ARGs after FROM reach RUN's environment; those before FROM were already used for FROM."""
    if plan.from_seen:
        plan.args.update(word.split("=", 1) for word in instruction.args if "=" in word)


def _plan_env(plan: _Plan, instruction: Instruction, where: str) -> None:
    plan.env.update(word.split("=", 1) for word in instruction.args)


def _plan_workdir(plan: _Plan, instruction: Instruction, where: str) -> None:
    plan.workdir = posixpath.normpath(posixpath.join(plan.workdir, instruction.args))


def _plan_user(plan: _Plan, instruction: Instruction, where: str) -> None:
    plan.user = str(instruction.args)


def _plan_run(plan: _Plan, instruction: Instruction, where: str) -> None:
    if instruction.flags:
        raise DockerfileError(f"{where}: RUN --{next(iter(instruction.flags))} is {UNSUPPORTED}")
    args = instruction.args
    command = shlex.join(args) if isinstance(args, list) else args
    plan.steps.append(RunStep(command, plan.workdir, {**plan.args, **plan.env}, plan.user))


def _plan_copy(plan: _Plan, instruction: Instruction, where: str) -> None:
    keyword, flags = instruction.keyword, instruction.flags
    if "from" in flags:
        raise DockerfileError(f"{where}: needs Docker: {keyword} --from (multi-stage) is {UNSUPPORTED}")
    unknown = set(flags) - {"chown", "chmod", "link"}
    if unknown:
        raise DockerfileError(f"{where}: {keyword} --{sorted(unknown)[0]} is {UNSUPPORTED}")
    chmod = flags.get("chmod")
    if chmod is not None and not _CHMOD_RE.fullmatch(chmod):
        raise DockerfileError(f"{where}: {keyword} --chmod={chmod} must be octal digits such as 755")
    *sources, dest = instruction.args
    many = len(sources) > 1 or any(char in source for source in sources for char in "*?[")
    if many and not dest.endswith("/"):
        raise DockerfileError(f"{where}: with several sources or a pattern the destination must end with /")
    dest_abs = _destination(plan.workdir, dest)
    for source in sources:
        if keyword == "ADD":
            _check_add_source(source, where)
        plan.steps.append(CopyStep(_context_path(source, where), dest_abs, chmod, flags.get("chown")))


def _check_add_source(source: str, where: str) -> None:
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", source) or source.startswith("git@"):
        raise DockerfileError(f"{where}: needs Docker: ADD of a URL ({source}) is {UNSUPPORTED}")
    if source.lower().endswith(_ARCHIVE_SUFFIXES):
        raise DockerfileError(f"{where}: needs Docker: ADD of an archive ({source}) is {UNSUPPORTED}; "
                              f"use COPY and RUN tar")


def _context_path(source: str, where: str) -> str:
    """A source relative to the build context (a leading / means the context's root, as in Docker)."""
    rel = posixpath.normpath(source.lstrip("/") or ".")
    if rel == ".." or rel.startswith("../"):
        raise DockerfileError(f"{where}: COPY source {source!r} is outside the build context")
    return rel


def _destination(workdir: str, dest: str) -> str:
    path = posixpath.normpath(posixpath.join(workdir, dest))
    is_folder = dest.endswith("/") or posixpath.basename(dest.rstrip("/")) in (".", "")
    return path if path.endswith("/") or not is_folder else path + "/"


def _ignore(plan: _Plan, instruction: Instruction, where: str) -> None:
    """CMD, ENTRYPOINT, EXPOSE, LABEL, ...: nothing the file system keeps."""


def _plan_shell(plan: _Plan, instruction: Instruction, where: str) -> None:
    raise DockerfileError(f"{where}: SHELL is {UNSUPPORTED} (RUN lines run with /bin/sh -c)")


def _plan_second_from(plan: _Plan, instruction: Instruction, where: str) -> None:
    raise DockerfileError(f"{where}: multi-stage builds are {UNSUPPORTED}")


_PLANNERS: dict[str, Callable[[_Plan, Instruction, str], None]] = {
    "FROM": _plan_second_from, "ARG": _plan_arg, "ENV": _plan_env, "WORKDIR": _plan_workdir,
    "USER": _plan_user, "RUN": _plan_run, "COPY": _plan_copy, "ADD": _plan_copy, "SHELL": _plan_shell,
    **{keyword: _ignore for keyword in IGNORED},
}
