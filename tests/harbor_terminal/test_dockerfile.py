"""The Dockerfile reader behind the bwrap backend: what it parses, what it plans, what it refuses."""

from __future__ import annotations

import re
import shlex

import pytest
from skyrl_harbor_terminal.dockerfile import (
    CopyStep,
    DockerfileError,
    Instruction,
    RunStep,
    parse_dockerfile,
    plan_for_bwrap,
)

BASE = "skyrl-terminal-base:bookworm-1"

TASK_DOCKERFILE = f"""\
# syntax=docker/dockerfile:1
ARG BASE={BASE}
FROM ${{BASE}}

ARG APP_DIR=/app
ARG PYVER
ENV DEBIAN_FRONTEND=noninteractive \\
    GREETING="hello world" HOME_DIR=$APP_DIR
ENV LEGACY value with spaces

# install what the task needs
RUN apt-get update && \\
    # a comment inside a continuation is dropped, as Docker does
    apt-get install -y --no-install-recommends make && \\
    rm -rf /var/lib/apt/lists/*
WORKDIR ${{APP_DIR}}
COPY --chmod=755 run.sh ./
COPY --chown=agent:agent ["data dir/input.txt", "/srv/data/"]
COPY src/*.py lib/
WORKDIR src
RUN ["python3", "-c", "print('it''s $HOME')"]
USER agent
EXPOSE 8080
LABEL maintainer="ada@example.org"
CMD ["bash"]
"""


def test_parses_a_realistic_task_dockerfile() -> None:
    instructions = parse_dockerfile(TASK_DOCKERFILE)
    assert [(i.keyword, i.line) for i in instructions] == [
        ("ARG", 2), ("FROM", 3), ("ARG", 5), ("ARG", 6), ("ENV", 7), ("ENV", 9), ("RUN", 12), ("WORKDIR", 16),
        ("COPY", 17), ("COPY", 18), ("COPY", 19), ("WORKDIR", 20), ("RUN", 21), ("USER", 22), ("EXPOSE", 23),
        ("LABEL", 24), ("CMD", 25)]
    by_line = {i.line: i for i in instructions}
    assert by_line[3].args == BASE
    assert by_line[7].args == ["DEBIAN_FRONTEND=noninteractive", "GREETING=hello world", "HOME_DIR=/app"]
    assert by_line[9].args == ["LEGACY=value with spaces"]
    assert by_line[12].form == "shell" and by_line[12].args == (
        "apt-get update &&     apt-get install -y --no-install-recommends make &&     rm -rf /var/lib/apt/lists/*")
    assert by_line[16].args == "/app"
    assert by_line[17] == Instruction("COPY", ["run.sh", "./"], 17, "shell", {"chmod": "755"})
    assert by_line[18] == Instruction("COPY", ["data dir/input.txt", "/srv/data/"], 18, "exec", {"chown": "agent:agent"})
    assert by_line[21] == Instruction("RUN", ["python3", "-c", "print('it''s $HOME')"], 21, "exec")
    assert by_line[25].form == "exec" and by_line[25].args == ["bash"]


def test_plan_keeps_order_and_the_context_of_each_run() -> None:
    recipe = plan_for_bwrap(parse_dockerfile(TASK_DOCKERFILE), BASE)
    assert recipe.workdir == "/app/src"
    assert recipe.user == "agent"
    assert recipe.env == {"DEBIAN_FRONTEND": "noninteractive", "GREETING": "hello world", "HOME_DIR": "/app",
                          "LEGACY": "value with spaces"}
    assert recipe.copies == [("run.sh", "/app/", "755"), ("data dir/input.txt", "/srv/data/", None),
                             ("src/*.py", "/app/lib/", None)]
    install, python = (step for step in recipe.steps if isinstance(step, RunStep))
    assert install.workdir == "/" and install.user is None
    assert install.env == {"APP_DIR": "/app", **recipe.env}  # ARG values reach RUN, PYVER (no value) does not
    assert python.workdir == "/app/src"
    assert shlex.split(python.command) == ["python3", "-c", "print('it''s $HOME')"]  # exec form, no shell expansion
    assert recipe.runs == [install.command, python.command]
    assert [type(step).__name__ for step in recipe.steps] == ["RunStep", "CopyStep", "CopyStep", "CopyStep", "RunStep"]
    assert recipe.steps[2] == CopyStep("data dir/input.txt", "/srv/data/", None, "agent:agent")


def test_defaults_without_workdir_or_user() -> None:
    recipe = plan_for_bwrap(parse_dockerfile(f"FROM {BASE}\nRUN touch /marker\n"), BASE)
    assert (recipe.workdir, recipe.user, recipe.env) == ("/", None, {})
    assert recipe.steps == (RunStep("touch /marker", "/", {}, None),)


@pytest.mark.parametrize(("line", "expected"), [
    ('ENV A="$X" B=\'$X\' C=\\$X', ["A=1", "B=$X", "C=$X"]),
    ("ENV A=${X:-d} B=${MISSING:-d} C=${X:+alt} D=${MISSING:+alt} E=${EMPTY-d} F=${EMPTY:-d}",
     ["A=1", "B=d", "C=alt", "D=", "E=", "F=d"]),
    ("ENV A=${MISSING:-${X}0}", ["A=10"]),
])
def test_variable_substitution(line: str, expected: list[str]) -> None:
    instructions = parse_dockerfile(f"FROM {BASE}\nARG X=1\nARG EMPTY=\n{line}\n")
    assert instructions[-1].args == expected


def test_base_image_environment_feeds_substitution() -> None:
    text = f"FROM {BASE}\nENV PATH=/opt/tool/bin:$PATH\n"
    assert parse_dockerfile(text)[-1].args == ["PATH=/opt/tool/bin:"]  # unknown without the base's env
    instructions = parse_dockerfile(text, base_env={"PATH": "/usr/bin:/bin"})
    assert instructions[-1].args == ["PATH=/opt/tool/bin:/usr/bin:/bin"]
    assert plan_for_bwrap(instructions, BASE).env == {"PATH": "/opt/tool/bin:/usr/bin:/bin"}


def test_env_overrides_arg_and_global_args_are_inherited_after_from() -> None:
    text = f"ARG VERSION=3\nFROM {BASE}\nARG VERSION\nARG NAME=arg\nENV NAME=env\nWORKDIR /opt/$NAME-$VERSION\n"
    instructions = parse_dockerfile(text)
    assert instructions[2].args == ["VERSION=3"]
    assert instructions[-1].args == "/opt/env-3"


def test_arg_before_from_is_not_visible_after_it_unless_redeclared() -> None:
    instructions = parse_dockerfile(f"ARG DIR=/x\nFROM {BASE}\nWORKDIR /base$DIR\n")
    assert instructions[-1].args == "/base"


@pytest.mark.parametrize(("text", "message"), [
    (f"FROM {BASE} AS build\nRUN make\n", "Dockerfile:1: multi-stage builds are not supported by the bwrap backend"),
    (f"FROM {BASE}\nRUN make\nFROM {BASE}\n", "Dockerfile:3: multi-stage builds are not supported"),
    (f"FROM {BASE}\nRUN <<EOF\necho hi\nEOF\n", "Dockerfile:2: heredocs (<<EOF) are not supported by the bwrap backend"),
    (f"FROM {BASE}\nCOPY <<-\"END\" /app/x\nEND\n", "Dockerfile:2: heredocs"),
    ("# escape=`\nFROM base\n", "Dockerfile:1: escape=` is not supported"),
    (f"FROM {BASE}\nFETCH http://x\n", "Dockerfile:2: unknown instruction FETCH"),
    (f"FROM {BASE}\nWORKDIR\n", "Dockerfile:2: WORKDIR needs arguments"),
    (f"FROM {BASE}\nCOPY onlyone\n", "Dockerfile:2: COPY needs a source and a destination"),
    (f"FROM {BASE}\nENV A=1 B\n", "Dockerfile:2: ENV expects NAME=value pairs"),
    (f"FROM {BASE}\nENV A=\"open\n", "Dockerfile:2: unterminated double quote"),
    (f"FROM {BASE}\nENV A=${{X/a/b}}\n", "Dockerfile:2: ${X/a/b} is not supported"),
])
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=re.escape(message)):
        parse_dockerfile(text)


def test_shell_heredoc_lookalikes_are_not_heredocs() -> None:
    (_, run, arith) = parse_dockerfile(f"FROM {BASE}\nRUN cat <<< \"$x\"\nRUN echo $((1<<3))\n")
    assert run.args == 'cat <<< "$x"' and arith.args == "echo $((1<<3))"


@pytest.mark.parametrize(("body", "message"), [
    ("FROM python:3.12-slim\n", "Dockerfile:1: needs Docker: FROM python:3.12-slim"),
    (f"FROM --platform=linux/amd64 {BASE}\n", "Dockerfile:1: FROM --platform is not supported"),
    (f"FROM {BASE}\nADD https://example.org/tool.sh /usr/local/bin/\n", "Dockerfile:2: needs Docker: ADD of a URL"),
    (f"FROM {BASE}\nADD vendor.tar.gz /opt/\n", "Dockerfile:2: needs Docker: ADD of an archive (vendor.tar.gz)"),
    (f"FROM {BASE}\nCOPY --from=builder /out /app/\n", "Dockerfile:2: needs Docker: COPY --from"),
    (f"FROM {BASE}\nCOPY ../secrets /app/\n", "Dockerfile:2: COPY source '../secrets' is outside the build context"),
    (f"FROM {BASE}\nCOPY a b /app\n", "Dockerfile:2: with several sources or a pattern the destination must end with /"),
    (f"FROM {BASE}\nCOPY --chmod=u+x run.sh /app/\n", "Dockerfile:2: COPY --chmod=u+x must be octal digits"),
    (f"FROM {BASE}\nCOPY --parents a/b /app/\n", "Dockerfile:2: COPY --parents is not supported"),
    (f"FROM {BASE}\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
     "Dockerfile:2: RUN --mount is not supported"),
    (f"FROM {BASE}\nSHELL [\"/bin/bash\", \"-c\"]\n", "Dockerfile:2: SHELL is not supported"),
    ("RUN true\nFROM base\n", "Dockerfile:1: RUN comes before FROM"),
    ("ARG X=1\n", "Dockerfile: has no FROM instruction"),
])
def test_plan_refuses_what_needs_docker(body: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=re.escape(message)):
        plan_for_bwrap(parse_dockerfile(body), BASE)


def test_plan_accepts_a_local_add_and_ignores_metadata_instructions() -> None:
    text = (f"FROM {BASE}\nADD --link /config.json .\nCMD [\"sleep\", \"infinity\"]\nENTRYPOINT [\"/bin/sh\"]\n"
            "HEALTHCHECK CMD true\nSTOPSIGNAL SIGTERM\nVOLUME /data\n")
    assert plan_for_bwrap(parse_dockerfile(text), BASE).steps == (CopyStep("config.json", "/", None, None),)


def test_copy_destinations_resolve_against_workdir() -> None:
    text = f"FROM {BASE}\nWORKDIR /app\nCOPY . .\nCOPY a.txt b.txt\nCOPY /c.txt /abs/c.txt\nCOPY d ../up/\n"
    assert plan_for_bwrap(parse_dockerfile(text), BASE).copies == [
        (".", "/app/", None), ("a.txt", "/app/b.txt", None), ("c.txt", "/abs/c.txt", None), ("d", "/up/", None)]
