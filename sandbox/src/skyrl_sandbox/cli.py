"""``skyrl-sandbox``: say which backends work here and what is missing (``doctor``), build the base image."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from .backends import BACKENDS, REQUIRE_ENV, STRONG, backend_problem
from .cgroups import cgroup_support
from .node import node_resources
from .seccomp import build_filter


def doctor() -> int:
    """Print one line per backend and per protection; exit 0 when a strong backend works."""
    rows = []
    for backend in BACKENDS:
        problem = backend_problem(backend)
        if backend == "subprocess":
            rows.append((backend, "opt-in", "works everywhere; weaker: no namespaces, in-process policy only"))
        else:
            rows.append((backend, "ok" if problem is None else "missing", problem or "ready"))
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
    usable = [name for name, state, _ in rows if name in STRONG and state == "ok"]
    print(f"\nbackend 'auto' picks: {usable[0] if usable else 'nothing (install bubblewrap or Docker)'}")
    return 0 if usable else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skyrl-sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    doctor_cmd = commands.add_parser("doctor", help="which backends and protections work here, and what is missing")
    doctor_cmd.add_argument("--ray-resources", action="store_true",
                            help="print only the JSON of this node's Ray resources, for `ray start --resources`")
    build = commands.add_parser("build-image", help="build the Docker base image from Debian packages (cached)")
    build.add_argument("--tag", default=None, help="image tag (default: the base image tag)")
    args = parser.parse_args(argv)
    if args.command == "doctor" and args.ray_resources:
        print(json.dumps(node_resources()))
        return 0
    if args.command == "doctor":
        return doctor()
    from .images import build_base_image

    build_base_image(**({"tag": args.tag} if args.tag else {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
