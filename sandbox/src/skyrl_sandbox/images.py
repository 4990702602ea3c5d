"""Docker images of the docker backend, built on this machine: nothing is ever pulled from a registry.

- The base image (:data:`BASE_TAG`): a minimal Debian with ``python3`` (the full standard library,
  nothing else), made by ``mmdebstrap --variant=minbase`` from Debian packages and imported with
  ``docker import``. Built once per engine (about 30 s) and cached by tag.
- Other Debian base images, declared by the packages that use them with
  :func:`register_base_image` (e.g. a terminal image with git and procps): built the same way.
- Task images: a folder with a Dockerfile ``FROM`` a local image (usually a base), built offline
  (``RUN`` steps have no network) and cached by tag plus a hash of the folder's contents.

Command line (``scripts/setup.sh`` runs the first)::

    python -m skyrl_sandbox.images                 # build the base image unless it exists
    python -m skyrl_sandbox.images --force         # rebuild it
    python -m skyrl_sandbox.images --context DIR --tag TAG   # build a task image from DIR/Dockerfile
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
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
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import BackendUnavailable, SandboxError

log = logging.getLogger(__name__)

BASE_TAG = "skyrl-sandbox-base:bookworm-1"  # bump the number when what goes into the image changes
SUITE = "bookworm"
PACKAGES = ("python3",)
MIRROR_ENV = "SKYRL_DEBIAN_MIRROR"  # a Debian mirror URL, or full sources.list lines separated by '|'
DEFAULT_MIRRORS = ("http://deb.debian.org/debian",
                   f"deb http://deb.debian.org/debian {SUITE}-updates main",
                   f"deb http://deb.debian.org/debian-security {SUITE}-security main")
IMAGE_LABEL = "skyrl.sandbox.image"
CONTEXT_LABEL = "skyrl.sandbox.context"
# What a minbase system needs no copy of: documentation, manuals, translations, apt's package lists.
_SLIM = ("--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
         "--dpkgopt=path-include=/usr/share/doc/*/copyright", "--dpkgopt=path-exclude=/usr/share/info/*",
         "--dpkgopt=path-exclude=/usr/share/locale/*",
         '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
_IMPORT_CHANGES = ("ENV LANG=C.UTF-8", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   'CMD ["/usr/bin/python3"]', f"LABEL {IMAGE_LABEL}=base")
# What the base image must be able to do: the modules sandbox workers use, in isolated mode.
_SMOKE_TEST = ["/usr/bin/python3", "-I", "-S", "-c", "import ctypes, json, resource, sqlite3, threading; print('ok')"]
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)
_LOG_TAIL = 40

Progress = Callable[[str], None]
_known: set[str] = set()  # tags seen on the engine by this process
_base_images: dict[str, tuple[str, ...]] = {BASE_TAG: PACKAGES}  # tag -> Debian packages beyond minbase


def register_base_image(tag: str, packages: Sequence[str]) -> str:
    """Declare a Debian base image (minbase plus ``packages``; python3 always included) built on demand.

    Task Dockerfiles ``FROM`` a declared tag get it built the first time they are built. Bump the
    tag when the package list changes: images are cached by tag.
    """
    wanted = tuple(dict.fromkeys(("python3", *packages)))
    known = _base_images.setdefault(tag, wanted)
    if known != wanted:
        raise ValueError(f"base image {tag} is already declared with packages {known}, not {wanted}")
    return tag
_build_lock = threading.Lock()


class ImageBuildError(SandboxError):
    """Building an image failed; the message holds the tail of the build's output."""


def image_exists(tag: str) -> bool:
    """Whether the engine has an image with this tag (no pull is ever attempted)."""
    import docker

    from .docker_engine import shared_client

    try:
        shared_client().api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def base_image_problem(tag: str = BASE_TAG) -> str | None:
    """None when the base image is on the engine; else what is missing and how to build it."""
    from .docker_engine import engine_problem

    problem = engine_problem()
    if problem:
        return problem
    if image_exists(tag):
        return None
    hint = "" if shutil.which("mmdebstrap") else " (needs mmdebstrap: apt-get install mmdebstrap)"
    return f"the base image {tag} is not built yet: run `python -m skyrl_sandbox.images`{hint}"


def base_image_unavailable(tag: str = BASE_TAG) -> str | None:
    """None when the base image exists or can be built here (engine and mmdebstrap present); else why not."""
    from .docker_engine import engine_problem

    problem = engine_problem()
    if problem or image_exists(tag) or shutil.which("mmdebstrap"):
        return problem
    return f"the base image {tag} is not built and mmdebstrap, which builds it, is not installed"


def ensure_base_image(tag: str = BASE_TAG, progress: Progress | None = None) -> str:
    """A declared base image's tag, building it first when the engine does not have it (once per engine)."""
    if tag in _known:
        return tag
    with _build_lock, _machine_lock():
        if not image_exists(tag):
            build_base_image(tag, progress=progress)
        _known.add(tag)
    return tag


def forget(tag: str) -> None:
    """Stop assuming ``tag`` exists (after the engine said it does not)."""
    _known.discard(tag)


def build_base_image(tag: str = BASE_TAG, *, force: bool = False, mirrors: Sequence[str] | None = None,
                     progress: Progress | None = None) -> str:
    """Build a declared base image from Debian packages (mmdebstrap minbase + its packages, then ``docker import``).

    Skips the build when ``tag`` exists unless ``force``. ``mirrors`` defaults to ``$SKYRL_DEBIAN_MIRROR``
    (``|``-separated), else deb.debian.org with the updates and security suites. Raises
    :class:`BackendUnavailable` when mmdebstrap or the engine is missing, :class:`ImageBuildError` when
    the build fails.
    """
    say = progress or _log_progress
    _require_engine()
    if not force and image_exists(tag):
        say(f"{tag} exists; nothing to build")
        return tag
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise BackendUnavailable("docker", f"cannot build the Docker base image {tag}: mmdebstrap is not installed "
                                 "(Debian/Ubuntu: apt-get install mmdebstrap; or scripts/setup.sh as root)")
    packages = _base_images.get(tag, PACKAGES)
    if mirrors is None:
        mirrors = os.environ[MIRROR_ENV].split("|") if os.environ.get(MIRROR_ENV) else DEFAULT_MIRRORS
    started = time.monotonic()
    say(f"building the Docker base image {tag} from Debian {SUITE} packages ({', '.join(packages)}); "
        "this takes about 30 s, once")
    with tempfile.TemporaryDirectory(prefix="skyrl-sandbox-image-") as folder:
        rootfs = Path(folder) / "rootfs.tar"
        argv = [mmdebstrap, "--variant=minbase", f"--include={','.join(packages)}", *_SLIM, SUITE, str(rootfs),
                *mirrors]
        _run_logged(argv, say, "mmdebstrap")
        say(f"importing {rootfs.stat().st_size / 2**20:.0f} MiB into Docker as {tag}")
        repository, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
        from .docker_engine import shared_client

        api = shared_client().api
        try:
            api.import_image_from_file(str(rootfs), repository=repository, tag=version, changes=list(_IMPORT_CHANGES))
        except Exception as exc:  # noqa: BLE001 - the SDK's errors vary; the message is what matters
            raise ImageBuildError(f"docker import of the base image {tag} failed: {exc}") from exc
    _smoke_test(tag, say)
    _known.add(tag)
    say(f"built {tag} in {time.monotonic() - started:.1f} s")
    return tag


def build_image(context_dir: str | os.PathLike, tag: str, *, dockerfile: str = "Dockerfile", base: str = BASE_TAG,
                force: bool = False, progress: Progress | None = None, timeout_s: float | None = None,
                log_file: str | os.PathLike | None = None) -> str:
    """Build a task image from ``context_dir`` offline and return ``tag``.

    Every ``FROM`` must name an image already on the engine (a declared base image is built when it
    is the one named); ``RUN`` steps run without network. The image is labelled with a hash of the
    folder and rebuilt only when that changed (or with ``force``). A build still running after
    ``timeout_s`` is abandoned (the engine cancels it when the connection closes) with an
    :class:`ImageBuildError`; ``log_file`` receives the whole build output.
    """
    say = progress or _log_progress
    _require_engine()
    context = Path(context_dir).resolve()
    recipe = context / dockerfile
    if not recipe.is_file():
        raise ImageBuildError(f"no {dockerfile} in {context}")
    _check_from_lines(recipe.read_text(errors="replace"), recipe, base, say)
    digest = context_digest(context)
    import docker

    from .docker_engine import shared_client

    api = shared_client().api
    if not force:
        try:
            labels = api.inspect_image(tag)["Config"].get("Labels") or {}
        except docker.errors.ImageNotFound:
            labels = {}
        if labels.get(CONTEXT_LABEL) == digest:
            say(f"{tag} is up to date with {context}")
            _known.add(tag)
            return tag
    started = time.monotonic()
    say(f"building {tag} from {recipe} (offline)")
    tail: deque[str] = deque(maxlen=_LOG_TAIL)
    log = open(log_file, "w", encoding="utf-8") if log_file else None  # noqa: SIM115 - closed below
    stream = api.build(path=str(context), dockerfile=dockerfile, tag=tag, pull=False, rm=True, forcerm=True,
                       network_mode="none", labels={IMAGE_LABEL: "task", CONTEXT_LABEL: digest}, decode=True,
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
    _known.add(tag)
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


def _check_from_lines(text: str, recipe: Path, base: str, say: Progress) -> None:
    stages: set[str] = set()
    for match in _FROM.finditer(text):
        image, stage = match.group(1), match.group(2)
        if image.lower() not in stages and image.lower() != "scratch" and "$" not in image:
            if image == base or image in _base_images:
                ensure_base_image(image, progress=say)
            elif not image_exists(image):
                raise ImageBuildError(f"{recipe}: FROM {image} is not an image on this Docker Engine, and nothing is "
                                      f"pulled (no registry is used); build it first, or start FROM {base}")
        if stage:
            stages.add(stage.lower())


def _smoke_test(tag: str, say: Progress) -> None:
    from .docker_engine import shared_client

    api = shared_client().api
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


def _require_engine() -> None:
    from .docker_engine import engine_problem

    problem = engine_problem()
    if problem:
        raise BackendUnavailable("docker", f"cannot build Docker images: {problem}")


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skyrl_sandbox.images",
                                     description="Build the Docker images of skyrl-sandbox locally (nothing is pulled).")
    parser.add_argument("--tag", help=f"image tag (default for the base image: {BASE_TAG})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    parser.add_argument("--mirror", action="append", help="Debian mirror URL or sources.list line (repeatable; "
                        f"default: ${MIRROR_ENV} or deb.debian.org)")
    parser.add_argument("--context", help="build a task image from this folder's Dockerfile instead (needs --tag)")
    parser.add_argument("--dockerfile", default="Dockerfile", help="the Dockerfile's name inside --context")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        if args.context:
            if not args.tag:
                parser.error("--context needs --tag")
            build_image(args.context, args.tag, dockerfile=args.dockerfile, force=args.force, progress=say)
        else:
            build_base_image(args.tag or BASE_TAG, force=args.force, mirrors=args.mirror, progress=say)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
