"""``skyrl-sandbox``: say which backends work here and what is missing (``doctor``), build the base image."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from .backend import SandboxBackend
from .cgroups import cgroup_support
from .choice import REQUIRE_ENV, strong_names
from .errors import SandboxError
from .node import node_resources
from .registry import registered
from .seccomp import build_filter


def backend_row(backend: SandboxBackend) -> tuple[str, str, str]:
    """The doctor's line for one backend: its name, whether it works here, and what it protects or what is missing."""
    problem = backend.problem()
    if problem is not None:
        return backend.name, "missing", f"{problem}. To fix: {backend.install_hint}"
    if not backend.strong:
        return backend.name, "opt-in", f"weaker, used only when a config names it: {backend.protects}"
    return backend.name, "ok", f"ready: {backend.protects}"


def doctor() -> int:
    """Print one line per installed backend and per protection; exit 0 when a strong backend works."""
    rows = [backend_row(backend) for backend in registered().values()]
    auto = next((name for name, state, _ in rows if state == "ok"), None)  # strong ones come first, in auto's order
    support = cgroup_support()
    rows.append(("cgroups", "ok" if support else "missing",
                 support.describe() if support else "no writable cgroup: threads bounded by RLIMIT_NPROC (not for "
                 "root), memory by RLIMIT_AS plus tmpfs sizes"))
    machine = platform.machine()
    rows.append(("seccomp", "ok" if build_filter(False, machine=machine) else "missing",
                 f"filter for {machine}" if build_filter(False, machine=machine) else
                 f"no filter for {machine}: process creation and signals are limited by the backend alone"))
    if os.environ.get(REQUIRE_ENV):
        rows.append((REQUIRE_ENV, "set", f"every sandbox of a run must use {os.environ[REQUIRE_ENV]}"))
    width = max(len(name) for name, _, _ in rows)
    for name, state, detail in rows:
        print(f"{name:<{width}}  {state:<7}  {detail}")
    print(f"\nbackend 'auto' picks: {auto or 'nothing (install one of: ' + ', '.join(strong_names()) + ')'}")
    return 0 if auto else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyrl-sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    doctor_cmd = commands.add_parser("doctor", help="which backends and protections work here, and what is missing")
    doctor_cmd.add_argument("--ray-resources", action="store_true",
                            help="print only the JSON of this node's Ray resources, for `ray start --resources`")
    build = commands.add_parser("build-image", help="build the base image from Debian packages (cached)")
    build.add_argument("--tag", default=None, help="image tag (default: the base image tag)")
    build.add_argument("--backend", default=None, help="the container backend whose engine gets the image "
                                                       "(default: the first installed one, in auto's order)")
    args = parser.parse_args(argv)
    if args.command == "doctor" and args.ray_resources:
        print(json.dumps(node_resources()))
        return 0
    if args.command == "doctor":
        return doctor()
    from .backends.docker.images import build_base_image, image_engine

    try:
        build_base_image(image_engine(args.backend), **({"tag": args.tag} if args.tag else {}))
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
