"""Docker images of the docker backend, built on this machine: nothing is ever pulled from a registry.

- The base image (:data:`BASE_TAG`): a minimal Debian with ``python3`` (the full standard library,
  nothing else), made by ``mmdebstrap --variant=minbase`` from Debian packages and imported with
  ``docker import``. Built once per engine (about 30 s) and cached by tag.
- Other Debian base images, declared by the packages that use them with
  :func:`register_base_image` (e.g. a terminal image with git and procps, or a stand-in for a
  public image from another Debian suite with its own ``ENV``): built the same way.
- Task images: a folder with a Dockerfile ``FROM`` a local image (usually a base), built offline
  (``RUN`` steps have no network unless the caller asks for the host's) and cached by tag plus a
  hash of the folder's contents (and of the Dockerfile text, when the caller supplies it).

Command line (``scripts/setup.sh`` runs the first)::

    python -m skyrl_sandbox.backends.docker.images                 # build the base image unless it exists
    python -m skyrl_sandbox.backends.docker.images --force         # rebuild it
    python -m skyrl_sandbox.backends.docker.images --context DIR --tag TAG   # build a task image from DIR/Dockerfile
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...container_engine import ContainerEngine
from ...errors import BackendUnavailable, SandboxError

log = logging.getLogger(__name__)

BASE_TAG = "skyrl-sandbox-base:bookworm-1"  # bump the number when what goes into the image changes
SUITE = "bookworm"
PACKAGES = ("python3",)
MIRROR_ENV = "SKYRL_DEBIAN_MIRROR"  # a Debian mirror URL, or full sources.list lines separated by '|'


def default_mirrors(suite: str) -> tuple[str, ...]:
    """deb.debian.org with the suite's updates and security suites."""
    return ("http://deb.debian.org/debian", f"deb http://deb.debian.org/debian {suite}-updates main",
            f"deb http://deb.debian.org/debian-security {suite}-security main")


DEFAULT_MIRRORS = default_mirrors(SUITE)
IMAGE_LABEL = "skyrl.sandbox.image"
CONTEXT_LABEL = "skyrl.sandbox.context"
# What a minbase system needs no copy of: documentation, manuals, translations, apt's package lists.
_SLIM = ("--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
         "--dpkgopt=path-include=/usr/share/doc/*/copyright", "--dpkgopt=path-exclude=/usr/share/info/*",
         "--dpkgopt=path-exclude=/usr/share/locale/*",
         '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
_BASE_ENV = {"LANG": "C.UTF-8", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# What the base image must be able to do: the modules sandbox workers use, in isolated mode.
_SMOKE_TEST = ["/usr/bin/python3", "-I", "-S", "-c", "import ctypes, json, resource, sqlite3, threading; print('ok')"]
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)
_LOG_TAIL = 40

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaseImage:
    """What goes into a declared base image: Debian packages beyond minbase, and the image's settings."""

    packages: tuple[str, ...]
    suite: str = SUITE
    env: tuple[tuple[str, str], ...] = ()  # on top of LANG and PATH (may replace them)
    labels: tuple[tuple[str, str], ...] = ()
    cmd: tuple[str, ...] = ("/usr/bin/python3",)


_known: set[tuple[str, str]] = set()  # (engine, tag) seen by this process
_base_images: dict[str, BaseImage] = {BASE_TAG: BaseImage(PACKAGES)}


def register_base_image(tag: str, packages: Sequence[str], *, suite: str = SUITE,
                        env: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
                        cmd: Sequence[str] = ("/usr/bin/python3",)) -> str:
    """Declare a Debian base image (minbase of ``suite`` plus ``packages``; python3 always included) built on demand.

    Task Dockerfiles ``FROM`` a declared tag get it built the first time they are built. ``env``,
    ``labels`` and ``cmd`` become the image's settings. Bump the tag when any of it changes: images
    are cached by tag.
    """
    wanted = BaseImage(tuple(dict.fromkeys(("python3", *packages))), suite, tuple((env or {}).items()),
                       tuple((labels or {}).items()), tuple(cmd))
    known = _base_images.setdefault(tag, wanted)
    if known != wanted:
        raise ValueError(f"base image {tag} is already declared as {known}, not {wanted}")
    return tag


def declared_base_image(tag: str) -> BaseImage | None:
    """What :func:`register_base_image` declared for ``tag``, or None."""
    return _base_images.get(tag)


_build_lock = threading.Lock()


class ImageBuildError(SandboxError):
    """Building an image failed; the message holds the tail of the build's output."""


def image_exists(engine: ContainerEngine, tag: str) -> bool:
    """Whether ``engine`` has an image with this tag (no pull is ever attempted)."""
    import docker

    try:
        engine.shared_client().api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def base_image_problem(engine: ContainerEngine, tag: str = BASE_TAG) -> str | None:
    """None when the base image is on ``engine``; else what is missing and how to build it."""
    problem = engine.problem()
    if problem:
        return problem
    if image_exists(engine, tag):
        return None
    hint = "" if shutil.which("mmdebstrap") else " (needs mmdebstrap: apt-get install mmdebstrap)"
    return f"the base image {tag} is not built yet: run `python -m skyrl_sandbox.backends.docker.images`{hint}"


def base_image_unavailable(engine: ContainerEngine, tag: str = BASE_TAG) -> str | None:
    """None when the base image exists on ``engine`` or can be built here (engine and mmdebstrap present); else
    why not."""
    problem = engine.problem()
    if problem or image_exists(engine, tag) or shutil.which("mmdebstrap"):
        return problem
    return f"the base image {tag} is not built and mmdebstrap, which builds it, is not installed"


def ensure_base_image(engine: ContainerEngine, tag: str = BASE_TAG, progress: Progress | None = None) -> str:
    """A declared base image's tag, building it first when ``engine`` does not have it (once per engine)."""
    if (engine.name, tag) in _known:
        return tag
    with _build_lock, _machine_lock():
        if not image_exists(engine, tag):
            build_base_image(engine, tag, progress=progress)
        _known.add((engine.name, tag))
    return tag


def forget(engine: ContainerEngine, tag: str) -> None:
    """Stop assuming ``tag`` exists on ``engine`` (after the engine said it does not)."""
    _known.discard((engine.name, tag))


def build_base_image(engine: ContainerEngine, tag: str = BASE_TAG, *, force: bool = False,
                     mirrors: Sequence[str] | None = None,
                     progress: Progress | None = None) -> str:
    """Build a declared base image from Debian packages (mmdebstrap minbase + its packages, then ``docker import``).

    Skips the build when ``tag`` exists unless ``force``. ``mirrors`` defaults to ``$SKYRL_DEBIAN_MIRROR``
    (``|``-separated), else deb.debian.org with the updates and security suites. Raises
    :class:`BackendUnavailable` when mmdebstrap or the engine is missing, :class:`ImageBuildError` when
    the build fails.
    """
    say = progress or _log_progress
    _require_engine(engine)
    if not force and image_exists(engine, tag):
        say(f"{tag} exists; nothing to build")
        return tag
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise BackendUnavailable(engine.name, f"cannot build the base image {tag}: mmdebstrap is not installed "
                                 "(Debian/Ubuntu: apt-get install mmdebstrap; or scripts/setup.sh as root)")
    spec = _base_images.get(tag, _base_images[BASE_TAG])
    packages, suite = spec.packages, spec.suite
    if mirrors is None:
        mirrors = ([line.replace("{suite}", suite) for line in os.environ[MIRROR_ENV].split("|")]
                   if os.environ.get(MIRROR_ENV) else default_mirrors(suite))
    started = time.monotonic()
    say(f"building the Docker base image {tag} from Debian {suite} packages ({', '.join(packages)}); "
        "this takes about 30 s, once")
    with tempfile.TemporaryDirectory(prefix="skyrl-sandbox-image-") as folder:
        rootfs = Path(folder) / "rootfs.tar"
        argv = [mmdebstrap, "--variant=minbase", f"--include={','.join(packages)}", *_SLIM, suite, str(rootfs),
                *mirrors]
        try:
            _run_logged(argv, say, "mmdebstrap")
        except ImageBuildError as exc:
            raise ImageBuildError(f"Debian {suite} cannot be built here (for {tag}): {exc}") from exc
        say(f"importing {rootfs.stat().st_size / 2**20:.0f} MiB into the {engine.title} as {tag}")
        repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        api = engine.shared_client().api
        try:
            imported = api.import_image_from_file(str(rootfs), repository=repository, tag=version,
                                                  changes=_import_changes(spec))
            engine.after_import(api, imported, tag)
        except Exception as exc:  # noqa: BLE001 - the SDK's errors vary; the message is what matters
            raise ImageBuildError(f"importing the base image {tag} into the {engine.title} failed: {exc}") from exc
    _smoke_test(engine, tag, say)
    _known.add((engine.name, tag))
    say(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def build_image(engine: ContainerEngine, context_dir: str | os.PathLike, tag: str, *, dockerfile: str = "Dockerfile",
                base: str = BASE_TAG,
                force: bool = False, progress: Progress | None = None, timeout_s: float | None = None,
                log_file: str | os.PathLike | None = None, dockerfile_text: str | None = None,
                network: bool = False, notes: Sequence[str] = (), buildargs: Mapping[str, str] | None = None) -> str:
    """Build a task image from ``context_dir`` offline and return ``tag``.

    Every ``FROM`` must name an image already on the engine (a declared base image is built when it
    is the one named); ``RUN`` steps run without network, or in the host's network with ``network``.
    ``dockerfile_text`` replaces the Dockerfile's text for this build (the file on disk is left
    as it is; the context goes to the engine as an archive holding the new text). The image is
    labelled with a hash of the folder (and of that text) and rebuilt only when that changed (or
    with ``force``). A build still running after ``timeout_s`` is abandoned (the engine cancels it
    when the connection closes) with an :class:`ImageBuildError`; ``log_file`` receives ``notes``
    and then the whole build output. ``buildargs`` are ``--build-arg`` values (part of the hash).
    """
    say = progress or _log_progress
    _require_engine(engine)
    context = Path(context_dir).resolve()
    recipe = context / dockerfile
    if not recipe.is_file():
        raise ImageBuildError(f"no {dockerfile} in {context}")
    text = recipe.read_text(errors="replace") if dockerfile_text is None else dockerfile_text
    _check_from_lines(engine, text, recipe, base, say)
    digest = context_digest(context)
    if dockerfile_text is not None:
        digest = hashlib.sha256(f"{digest}\0{dockerfile_text}".encode()).hexdigest()
    if buildargs:  # the build's --build-arg values make another image of the same folder
        digest = hashlib.sha256(f"{digest}\0{json.dumps(sorted(buildargs.items()))}".encode()).hexdigest()
    import docker

    api = engine.shared_client().api
    if not force:
        try:
            labels = api.inspect_image(tag)["Config"].get("Labels") or {}
        except docker.errors.ImageNotFound:
            labels = {}
        if labels.get(CONTEXT_LABEL) == digest:
            say(f"{tag} is up to date with {context}")
            _known.add((engine.name, tag))
            return tag
    started = time.monotonic()
    say(f"building {tag} from {recipe} ({'RUN steps in the host network' if network else 'offline'})")
    tail: deque[str] = deque(maxlen=_LOG_TAIL)
    log = open(log_file, "w", encoding="utf-8") if log_file else None  # noqa: SIM115 - closed below
    for note in notes:
        say(note)
        if log:
            log.write(note + "\n")
    where: dict[str, object] = {"path": str(context), "dockerfile": dockerfile}
    if dockerfile_text is not None:
        from docker.utils import build as build_utils

        name = ".skyrl-build.Dockerfile"  # the archive's .dockerignore names it, so COPY . leaves it out
        where = {"fileobj": build_utils.tar(str(context), exclude=_dockerignore(context),
                                            dockerfile=(name, dockerfile_text)),
                 "custom_context": True, "dockerfile": name}
    stream = api.build(**where, tag=tag, pull=False, rm=True, forcerm=True,
                       network_mode="host" if network else "none",
                       labels={IMAGE_LABEL: "task", CONTEXT_LABEL: digest}, decode=True, buildargs=dict(buildargs or {}),
                       timeout=None if timeout_s is None else max(int(timeout_s), 1))
    try:
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("error") or chunk.get("errorDetail", {}).get("message", "")
                if log:
                    log.write(f"ERROR: {detail}\n")
                raise ImageBuildError(f"building {tag} failed: {detail.strip()}\n" + "\n".join(tail))
            for line in str(chunk.get("stream") or chunk.get("status") or "").splitlines():
                if line.strip():
                    tail.append(line)
                    say(f"  {line}")
                    if log:
                        log.write(line + "\n")
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise ImageBuildError(f"building {tag} took longer than its build timeout ({timeout_s:g} s)\n"
                                      + "\n".join(tail))
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"building {tag} failed: {exc}\n" + "\n".join(tail)) from exc
    except OSError as exc:  # the HTTP read timed out: no output for timeout_s
        raise ImageBuildError(f"building {tag} took longer than its build timeout ({timeout_s} s): {exc}\n"
                              + "\n".join(tail)) from exc
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        if log:
            log.close()
    _known.add((engine.name, tag))
    say(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def context_digest(context: Path) -> str:
    """A hash of every file's relative path, mode and contents under ``context`` (symlinks by target)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            digest.update(str(path.relative_to(context)).encode() + b"\0")
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode())
                continue
            digest.update(oct(path.stat().st_mode & 0o777).encode())
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _dockerignore(context: Path) -> list[str] | None:
    """The patterns of ``context/.dockerignore``, as the Docker SDK reads them."""
    ignore = context / ".dockerignore"
    if not ignore.is_file():
        return None
    lines = [line.strip() for line in ignore.read_text(errors="replace").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _import_changes(spec: BaseImage) -> list[str]:
    """The ``docker import`` changes giving an image its settings (values JSON-quoted, as Dockerfiles allow)."""
    env = {**_BASE_ENV, **dict(spec.env)}
    labels = {IMAGE_LABEL: "base", **dict(spec.labels)}
    return ([f"ENV {key}={json.dumps(value)}" for key, value in env.items()]
            + [f"LABEL {key}={json.dumps(value)}" for key, value in labels.items()]
            + [f"CMD {json.dumps(list(spec.cmd))}"])


def _check_from_lines(engine: ContainerEngine, text: str, recipe: Path, base: str, say: Progress) -> None:
    stages: set[str] = set()
    for match in _FROM.finditer(text):
        image, stage = match.group(1), match.group(2)
        if image.lower() not in stages and image.lower() != "scratch" and "$" not in image:
            if image == base or image in _base_images:
                ensure_base_image(engine, image, progress=say)
            elif not image_exists(engine, image):
                raise ImageBuildError(f"{recipe}: FROM {image} is not an image on this {engine.title}, and nothing is "
                                      f"pulled (no registry is used); build it first, or start FROM {base}")
        if stage:
            stages.add(stage.lower())


def _smoke_test(engine: ContainerEngine, tag: str, say: Progress) -> None:
    api = engine.shared_client().api
    container = api.create_container(tag, _SMOKE_TEST, detach=True, network_disabled=True,
                                     host_config=api.create_host_config(network_mode="none"))["Id"]
    try:
        api.start(container)
        status = api.wait(container, timeout=60)["StatusCode"]
        output = api.logs(container).decode(errors="replace").strip()
    finally:
        api.remove_container(container, force=True, v=True)
    if status != 0 or output != "ok":
        api.remove_image(tag, force=True)
        raise ImageBuildError(f"the new image {tag} cannot run sandbox workers (exit {status}): {output[-2000:]}")
    say(f"{tag}: python3 and the standard library work")


def _run_logged(argv: list[str], say: Progress, name: str) -> None:
    tail: deque[str] = deque(maxlen=_LOG_TAIL)
    # stdin closed: given no terminal, mmdebstrap would read sources.list lines from it.
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as child:
        assert child.stdout is not None
        for line in child.stdout:
            line = line.rstrip()
            if line:
                tail.append(line)
                say(f"  {name}: {line}")
    if child.returncode != 0:
        raise ImageBuildError(f"{name} failed (exit {child.returncode}):\n" + "\n".join(tail))


def _require_engine(engine: ContainerEngine) -> None:
    problem = engine.problem()
    if problem:
        raise BackendUnavailable(engine.name, f"cannot build {engine.title} images: {problem}")


class _machine_lock:
    """One image build at a time on this machine (processes of a test run may all want the base image)."""

    def __enter__(self) -> None:
        self._file = open(Path(tempfile.gettempdir()) / "skyrl-sandbox-images.lock", "a")  # noqa: SIM115
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def _log_progress(line: str) -> None:
    # The first and last lines say why a sandbox start waits (once per engine); the rest is detail.
    level = logging.INFO if line.startswith("  ") else logging.WARNING
    log.log(level, "%s", line)


def image_engine(backend: str | None = None) -> ContainerEngine:
    """The engine of ``backend``, or of the first installed backend that runs images; SandboxError if it runs none."""
    from ...registry import get_backend, registered

    if backend is None:
        engines = [chosen.engine for chosen in registered().values() if chosen.runs_images and chosen.engine]
        if not engines:
            raise SandboxError("no installed sandbox backend runs container images")
        return engines[0]
    chosen = get_backend(backend)
    if chosen.engine is None:
        raise SandboxError(f"sandbox backend {backend!r} does not run container images")
    return chosen.engine


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skyrl_sandbox.backends.docker.images",
                                     description="Build the Docker images of skyrl-sandbox locally (nothing is pulled).")
    parser.add_argument("--tag", help=f"image tag (default for the base image: {BASE_TAG})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    parser.add_argument("--mirror", action="append", help="Debian mirror URL or sources.list line (repeatable; "
                        f"default: ${MIRROR_ENV} or deb.debian.org)")
    parser.add_argument("--context", help="build a task image from this folder's Dockerfile instead (needs --tag)")
    parser.add_argument("--dockerfile", default="Dockerfile", help="the Dockerfile's name inside --context")
    parser.add_argument("--backend", default=None, help="the container backend whose engine gets the image (default: "
                        "the first installed one, in auto's order)")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        engine = image_engine(args.backend)
        if args.context:
            if not args.tag:
                parser.error("--context needs --tag")
            build_image(engine, args.context, args.tag, dockerfile=args.dockerfile, force=args.force, progress=say)
        else:
            build_base_image(engine, args.tag or BASE_TAG, force=args.force, mirrors=args.mirror, progress=say)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
