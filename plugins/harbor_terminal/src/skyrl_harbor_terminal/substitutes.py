"""Offline base images: public images that task Dockerfiles start ``FROM``, built here from Debian packages.

Nothing is ever pulled, so a task whose Dockerfile starts ``FROM python:3.11-slim-bookworm`` could
not build on a machine without a registry. This map builds a stand-in for each public image it
knows (with ``mmdebstrap``, as the other base images are built) and rewrites the ``FROM`` lines at
build time; the Dockerfile on disk is never changed.

============================================  ==============================================================
public image                                  substitute
============================================  ==============================================================
``debian:<suite>[-slim]``, ``debian:<n>``     minbase of that suite (11 bullseye, 12 bookworm, 13 trixie;
                                              ``latest``/``stable`` trixie), with ``python3``
``python:<ver>[-slim][-<suite>]``             the suite whose ``python3`` is ``<ver>`` (bullseye 3.9, bookworm
                                              3.11, trixie 3.13), else the nearest (a warning names both
                                              versions); a named suite is always used. ``python``, ``pip``,
                                              ``venv``; ``PIP_BREAK_SYSTEM_PACKAGES=1`` lets ``pip install``
                                              write the system Python, as it does in the official image
``ubuntu:<ver>`` or codename                  the nearest Debian suite (20.04 bullseye, 22.04 bookworm, 24.04
                                              and later trixie, bookworm where trixie cannot be built), with a
                                              warning: its apt sources are Debian's, not Ubuntu's
============================================  ==============================================================

Digests (``@sha256:...``) and the ``docker.io/`` and ``library/`` prefixes are accepted and dropped
(the build log says so). Other registries and images (``nvidia/cuda``, ``ghcr.io/...``) cannot be
had: :class:`UnavailableImage` names the image and this map. Substitutes are declared as base
images of :mod:`skyrl_sandbox.backends.docker.images`, built once per engine, cached by tag
(``skyrl-substitute/python:3.11-slim-bookworm-1``) and labelled ``skyrl.substitutes`` with what they
stand for. An image already on the engine is always used as it is.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import tomllib
from skyrl_sandbox.backends.docker import images
from skyrl_sandbox.backends.docker.images import ImageBuildError

if TYPE_CHECKING:
    from skyrl_sandbox.container_engine import ContainerEngine

SUBSTITUTE_ENV = "SKYRL_SUBSTITUTE_IMAGES"  # default of env.substitute_images (unset: the settings file, else on)
BUILD_NETWORK_ENV = "SKYRL_BUILD_NETWORK"  # default of env.build_network (unset: the settings file, else off)
SETTINGS_ENV = "SKYRL_HARBOR_SETTINGS"  # path of this machine's settings file (default: settings_file())
VERSION = 1  # bump when what goes into a substitute changes: they are cached by tag
LABEL = "skyrl.substitutes"
SUITE_LABEL = "skyrl.substitute.suite"
REPOSITORY = "skyrl-substitute"
MAP_DOC = ("the offline base-image map (skyrl_harbor_terminal.substitutes; docs/packages/harbor_terminal.md, "
           "'Offline base images') covers debian:<suite>[-slim], python:<version>[-slim][-<suite>] and ubuntu:<version>")

SUITES = ("bullseye", "bookworm", "trixie")  # oldest first
SUITE_NUMBERS = {"11": "bullseye", "12": "bookworm", "13": "trixie"}
SUITE_ALIASES = {"latest": "trixie", "stable": "trixie", "oldstable": "bookworm", "oldoldstable": "bullseye"}
SUITE_PYTHON = {"bullseye": (3, 9), "bookworm": (3, 11), "trixie": (3, 13)}
UBUNTU_CODENAMES = {"bionic": "18.04", "focal": "20.04", "jammy": "22.04", "noble": "24.04", "oracular": "24.10",
                    "plucky": "25.04", "questing": "25.10", "latest": "24.04", "rolling": "25.10", "devel": "25.10"}
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates", "netbase",
                   "tzdata")
_DOCKER_HUB = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$", re.IGNORECASE)
_DATE = re.compile(r"^\d{8}$")
_PYTHON_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.\d+)?(?:(?:a|b|rc)\d+)?$")
_UBUNTU_VERSION = re.compile(r"^(\d{2})\.(\d{2})(?:\.\d+)?$")
_OFFLINE_SIGNS = ("Temporary failure resolving", "Temporary failure in name resolution", "Could not resolve",
                  "Network is unreachable", "No matching distribution", "Failed to establish a new connection")


class UnavailableImage(ImageBuildError):
    """An image a task needs is not on the engine and cannot be built here; the message names it."""


@dataclass(frozen=True)
class Substitute:
    """What stands in for one public image reference."""

    ref: str  # as the Dockerfile wrote it
    stands_for: str  # the image the substitute is, e.g. python:3.11-slim-bookworm
    tag: str  # the local image, e.g. skyrl-substitute/python:3.11-slim-bookworm-1
    suite: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cmd: tuple[str, ...] = ("bash",)
    notes: tuple[str, ...] = ()  # what was dropped from the reference
    warnings: tuple[str, ...] = ()  # where the substitute differs from the image asked for

    def declare(self) -> str:
        """Declare the substitute as a base image (built on first use) and return its tag."""
        return images.register_base_image(self.tag, self.packages, suite=self.suite, env=dict(self.env),
                                          labels={LABEL: self.stands_for, SUITE_LABEL: self.suite}, cmd=self.cmd)


def substitute_for(ref: str, *, buildable: Callable[[str], bool] | None = None) -> Substitute:
    """The substitute for a public image reference; :class:`UnavailableImage` when the map has none.

    ``buildable(suite)`` (default :func:`suite_buildable`) decides where ubuntu and python images
    without a suite may go; a suite named in the reference is used whether or not it is.
    """
    buildable = buildable or suite_buildable
    name, tag, notes = _normalise(ref)
    if name == "debian":
        return _debian(ref, tag, notes)
    if name == "python":
        return _python(ref, tag, notes, buildable)
    if name == "ubuntu":
        return _ubuntu(ref, tag, notes, buildable)
    raise UnavailableImage(f"{ref} cannot be had here: nothing is pulled (no registry is used), and {MAP_DOC}; "
                           "load it onto the engine first (docker load -i image.tar)")


def suite_buildable(suite: str) -> bool:
    """Whether this host can build ``suite``: mmdebstrap is installed and the archive keyring knows the suite."""
    if shutil.which("mmdebstrap") is None:
        return False
    folders = (Path("/usr/share/keyrings"), Path("/etc/apt/trusted.gpg.d"))
    return any(folder.is_dir() and any(folder.glob(f"debian-archive-{suite}-*")) for folder in folders)


# -- reading references -------------------------------------------------------------------------------


def _normalise(ref: str) -> tuple[str, str, list[str]]:
    """(name, tag, notes) with Docker Hub prefixes and the digest dropped."""
    notes: list[str] = []
    rest = ref.strip()
    digest = _DIGEST.search(rest)
    if digest:
        rest = rest[:digest.start()]
        notes.append(f"{ref}: digest {digest.group()[1:20]}... dropped (a substitute is built here, not pulled)")
    lowered = rest.lower()
    for prefix in _DOCKER_HUB:
        if lowered.startswith(prefix):
            rest = rest[len(prefix):]
            notes.append(f"{ref}: {prefix} prefix dropped")
            break
    if rest.lower().startswith("library/"):
        rest = rest[len("library/"):]
        notes.append(f"{ref}: library/ prefix dropped")
    colon = rest.rfind(":")
    name, tag = (rest[:colon], rest[colon + 1:]) if colon > rest.rfind("/") else (rest, "")
    return name.lower(), tag or "latest", notes  # a name with "/" (a namespace or registry) is in no map


def _unknown_tag(ref: str, forms: str) -> UnavailableImage:
    return UnavailableImage(f"{ref} cannot be had here: nothing is pulled (no registry is used), and the offline "
                            "base-image map (docs/packages/harbor_terminal.md, 'Offline base images') builds "
                            f"{forms}, not this tag; load it onto the engine first (docker load -i image.tar)")


def _debian(ref: str, tag: str, notes: list[str]) -> Substitute:
    parts = [part for part in tag.lower().split("-") if part != "slim" and not _DATE.match(part)]
    word = parts[0] if len(parts) == 1 else ""
    suite = SUITE_ALIASES.get(word) or SUITE_NUMBERS.get(word.split(".")[0]) or (word if word in SUITES else None)
    if suite is None:
        raise _unknown_tag(ref, f"debian:<suite>[-slim] and debian:<number>[-slim] for {', '.join(SUITES)} "
                                "(11, 12, 13)")
    return _debian_substitute(ref, suite, notes, ())


def _debian_substitute(ref: str, suite: str, notes: list[str], warnings: tuple[str, ...]) -> Substitute:
    return Substitute(ref=ref, stands_for=f"debian:{suite}-slim", tag=f"{REPOSITORY}/debian:{suite}-slim-{VERSION}",
                      suite=suite, packages=("python3",), notes=tuple(notes), warnings=warnings)


def _python(ref: str, tag: str, notes: list[str], buildable: Callable[[str], bool]) -> Substitute:
    version: tuple[int, int] | None = None
    suite: str | None = None
    words = tag.lower().split("-")
    if words and words[0] == "latest":
        words = words[1:]
    for index, word in enumerate(words):
        match = _PYTHON_VERSION.match(word)
        if index == 0 and match:
            version = (int(match.group(1)), int(match.group(2) or -1))
        elif word in SUITES and suite is None:
            suite = word
        elif word != "slim":
            raise _unknown_tag(ref, "python:<version>[-slim][-<suite>] on Debian "
                                    f"{', '.join(SUITES)} (no alpine or windows variants)")
    if version is not None and version[0] != 3:
        raise _unknown_tag(ref, f"Python 3 only (Python {version[0]} is in no Debian suite it builds)")
    warnings: list[str] = []
    if suite is None:
        suite = _nearest_suite(version, buildable)
    have = SUITE_PYTHON[suite]
    shown = ".".join(map(str, have))
    if version is None or version[1] < 0:
        warnings.append(f"{ref} names no minor version of Python; its substitute has Debian {suite}'s Python {shown}")
    elif version != have:
        warnings.append(f"{ref} asks for Python {version[0]}.{version[1]}, but its substitute has Debian {suite}'s "
                        f"Python {shown} (the nearest a Debian suite has); code or wheels needing "
                        f"{version[0]}.{version[1]} may not work")
    return Substitute(ref=ref, stands_for=f"python:{shown}-slim-{suite}", suite=suite, packages=PYTHON_PACKAGES,
                      tag=f"{REPOSITORY}/python:{shown}-slim-{suite}-{VERSION}",
                      env=(("PIP_BREAK_SYSTEM_PACKAGES", "1"),), cmd=("python3",), notes=tuple(notes),
                      warnings=tuple(warnings))


def _nearest_suite(version: tuple[int, int] | None, buildable: Callable[[str], bool]) -> str:
    """The buildable suite whose Python is nearest ``version`` (newer on a tie; the newest for None)."""
    candidates = [suite for suite in SUITES if buildable(suite)] or ["bookworm"]
    if version is None or version[1] < 0:
        return candidates[-1]
    return min(reversed(candidates), key=lambda suite: abs(SUITE_PYTHON[suite][1] - version[1]))


def _ubuntu(ref: str, tag: str, notes: list[str], buildable: Callable[[str], bool]) -> Substitute:
    word, *dates = tag.lower().split("-")
    match = _UBUNTU_VERSION.match(UBUNTU_CODENAMES.get(word, word))
    if not match or not all(_DATE.match(date) for date in dates):
        raise _unknown_tag(ref, "ubuntu:<version> (20.04, 22.04, 24.04, ...) or a release codename (focal, jammy, "
                                "noble, ...)")
    version = (int(match.group(1)), int(match.group(2)))
    suite = "bullseye" if version < (22, 4) else "bookworm" if version < (24, 4) else "trixie"
    fallback = ""
    if suite == "trixie" and not buildable("trixie"):
        suite, fallback = "bookworm", " (trixie, the nearest, cannot be built here)"
    warning = (f"{ref} is substituted by Debian {suite}{fallback}, not Ubuntu: its apt sources are Debian's "
               "(deb.debian.org), so Ubuntu-only packages and PPAs are not there, and package versions differ")
    return _debian_substitute(ref, suite, notes, (warning,))


# -- Dockerfiles ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageUse:
    """An image a Dockerfile needs: a ``FROM`` (not of an earlier stage) or a ``COPY --from`` of an image."""

    ref: str  # with the global ARGs' defaults filled in
    line: int  # 1-based
    instruction: str  # "FROM" or "COPY --from"
    written: str  # the text in the file (e.g. ${BASE})


_INSTRUCTION = re.compile(r"^\s*(\w+)\b(.*)$", re.DOTALL)
_FROM_ARGS = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.DOTALL)
_COPY_FROM = re.compile(r"(--from=)(\S+)", re.IGNORECASE)
_HEREDOC = re.compile(r"<<-?\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-+]([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def image_uses(text: str) -> list[ImageUse]:
    """The images ``text`` (a Dockerfile) needs, in order; stage names, ``scratch`` and numbers are not images."""
    uses: list[ImageUse] = []
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    seen_from = False
    for number, line in instruction_lines(text):
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        keyword = match.group(1).upper()
        if keyword == "ARG" and not seen_from:
            for word in match.group(2).split():
                key, _, value = word.partition("=")
                global_args[key] = value.strip("\"'")
        elif keyword == "FROM":
            seen_from = True
            parts = _FROM_ARGS.match(line)
            if not parts:
                continue
            written = parts.group(2)
            ref = _expand(written, global_args) or written  # an ARG without a default stays unresolved
            words = parts.group(3).split()
            if ref.lower() not in stages and ref.lower() != "scratch":
                uses.append(ImageUse(ref, number, "FROM", written))
            if len(words) >= 2 and words[0].upper() == "AS":
                stages.add(words[1].lower())
        elif keyword in ("COPY", "ADD"):
            copy = _COPY_FROM.search(line)
            if copy and copy.group(2).lower() not in stages and not copy.group(2).isdigit():
                uses.append(ImageUse(copy.group(2), number, "COPY --from", copy.group(2)))
    return uses


def rewrite(text: str, replacements: dict[str, str]) -> str:
    """``text`` with each image of :func:`image_uses` found in ``replacements`` replaced (other lines as they are)."""
    by_line = {use.line: use for use in image_uses(text) if use.ref in replacements}
    lines = text.splitlines(keepends=True)
    for number, use in by_line.items():
        line = lines[number - 1]
        if use.instruction == "FROM":
            parts = _FROM_ARGS.match(line)
            assert parts is not None
            line = parts.group(1) + replacements[use.ref] + parts.group(3)
        else:
            new = replacements[use.ref]
            line = _COPY_FROM.sub(lambda match, new=new: match.group(1) + new, line, count=1)
        lines[number - 1] = line
    return "".join(lines)


def instruction_lines(text: str) -> Iterable[tuple[int, str]]:
    """(number, text) of each physical line that starts an instruction (not continuations, comments, heredocs)."""
    continued = False
    heredocs: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if heredocs:
            if stripped == heredocs[0]:
                heredocs.pop(0)
            continue
        if not continued and stripped and not stripped.startswith("#"):
            yield number, line
            heredocs.extend(match.group(2) for match in _HEREDOC.finditer(line))
        if continued and (not stripped or stripped.startswith("#")):
            continue  # comments and blank lines inside a continued instruction do not end it
        continued = stripped.endswith("\\")


def _expand(word: str, variables: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        return variables.get(name) or (default or "")

    return _VARIABLE.sub(value, word)


# -- build plans ------------------------------------------------------------------------------------


@dataclass
class BuildPlan:
    """How a task's Dockerfile is built here: its text when FROM lines changed, and what the build log says."""

    text: str | None = None  # None: the file as it is
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    substitutes: list[Substitute] = field(default_factory=list)


def plan_build(dockerfile: Path, *, enabled: bool, exists: Callable[[str], bool]) -> BuildPlan:
    """What the build of ``dockerfile`` starts from: images on the engine (``exists(ref)``, e.g. :func:`on_engine`)
    as they are, others substituted.

    Raises :class:`UnavailableImage` for an image that is neither on the engine nor buildable here
    (or buildable only through the map while ``enabled`` is false).
    """
    text = dockerfile.read_text(errors="replace")
    plan = BuildPlan()
    replacements: dict[str, str] = {}
    for use in image_uses(text):
        where = f"{dockerfile}:{use.line}: {use.instruction} {use.ref}"
        if use.ref in replacements or "$" in use.ref or images.declared_base_image(use.ref) or exists(use.ref):
            continue
        bare = _DIGEST.sub("", use.ref)
        if bare != use.ref and exists(bare):
            replacements[use.ref] = bare
            plan.notes.append(f"{where}: the digest is not on this engine; using the local {bare} (digest not checked)")
            continue
        try:
            substitute = substitute_for(use.ref)
        except UnavailableImage as exc:
            raise UnavailableImage(f"{dockerfile}:{use.line}: {use.instruction} {exc}") from None
        if not enabled:
            raise UnavailableImage(
                f"{where}: the image is not on the engine, and nothing is pulled; the offline base-image map "
                f"could build it from Debian {substitute.suite} packages, but it is off: set env.substitute_images="
                f"true (or unset {SUBSTITUTE_ENV}=0), or load the image first")
        replacements[use.ref] = substitute.declare()
        plan.substitutes.append(substitute)
        plan.notes.extend(substitute.notes)
        plan.notes.append(f"{where} -> {substitute.tag} (a stand-in for {substitute.stands_for} built here from "
                          f"Debian {substitute.suite} packages; the Dockerfile on disk is unchanged)")
        plan.warnings.extend(substitute.warnings)
    if replacements:
        plan.text = rewrite(text, replacements)
    plan.notes.extend(f"warning: {warning}" for warning in plan.warnings)
    return plan


def on_engine(engine: ContainerEngine, ref: str) -> bool:
    """Whether ``engine`` has ``ref`` (a reference it cannot parse is not there)."""
    import docker

    try:
        return images.image_exists(engine, ref)
    except docker.errors.APIError:
        return False


# -- settings and build failures --------------------------------------------------------------------


def substitutes_enabled(setting: bool | None) -> bool:
    """``env.substitute_images``; None: ``$SKYRL_SUBSTITUTE_IMAGES``, else the settings file's
    ``substitute_images``, else on."""
    return _flag(setting, SUBSTITUTE_ENV, "substitute_images", default=True)


def build_network_enabled(setting: bool | None) -> bool:
    """``env.build_network``; None: ``$SKYRL_BUILD_NETWORK``, else the settings file's ``build_network``
    (``scripts/setup.sh`` writes ``build_network = true`` where this machine reaches the package mirrors),
    else off."""
    return _flag(setting, BUILD_NETWORK_ENV, "build_network", default=False)


def settings_file() -> Path:
    """This machine's harbor_terminal settings: ``$SKYRL_HARBOR_SETTINGS``, else
    ``$XDG_CONFIG_HOME/skyrl/harbor.toml`` (``~/.config/skyrl/harbor.toml``)."""
    if os.environ.get(SETTINGS_ENV):
        return Path(os.environ[SETTINGS_ENV])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "skyrl" / "harbor.toml"


def _flag(setting: bool | None, variable: str, key: str, *, default: bool) -> bool:
    if setting is not None:
        return setting
    value = os.environ.get(variable, "").strip().lower()
    if not value:
        saved = _saved_setting(key)
        return default if saved is None else saved
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{variable}={value!r}: expected 1 or 0")


def _saved_setting(key: str) -> bool | None:
    path = settings_file()
    if not path.is_file():
        return None
    try:
        value = tomllib.loads(path.read_text(encoding="utf-8")).get(key)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the harbor_terminal settings: {exc}") from exc
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{path}: {key} must be true or false, got {value!r}")
    return value


def offline_build_hint(output: str) -> str | None:
    """Why an offline build failed, when its output shows a RUN step reaching for the network; else None."""
    sign = next((sign for sign in _OFFLINE_SIGNS if sign in output), None)
    if sign is None:
        return None
    return (f"a RUN step needed the network ('{sign}'), but task image builds have none (build_network is off). "
            "Pre-bake what it downloads into an image on this engine and start FROM it, or let RUN steps of image "
            f"builds use the host's network: env.build_network=true (or {BUILD_NETWORK_ENV}=1). The agent's "
            "machine stays offline either way")
