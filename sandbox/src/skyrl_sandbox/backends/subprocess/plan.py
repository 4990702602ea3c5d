"""The plain worker's command line: the base interpreter with rlimits, seccomp and a clean environment, no namespaces."""

from __future__ import annotations

import os
from pathlib import Path

from ...launch import LaunchPlan, WorkerProgram, clean_env, python_args, python_executable, spawn_settings
from ...limits import Limits


def plan_subprocess(program: WorkerProgram, host_dir: Path, limits: Limits) -> LaunchPlan:
    tmp, inbox, lib = str(host_dir / "tmp"), str(host_dir / "inbox"), host_dir / "lib"
    lib.mkdir(exist_ok=True)
    for name, folder in program.all_packages.items():
        (lib / name).symlink_to(folder, target_is_directory=True)
    spawn = spawn_settings(limits, os.getpid())
    read_roots = tuple(str(folder) for folder in program.all_packages.values()) + program.read_only + (inbox,)
    return LaunchPlan(argv=python_args(program, python_executable(), [str(lib)], spawn), cwd=tmp, env=clean_env(tmp),
                      inside_tmp=tmp, inside_inbox=inbox, inside_read_roots=read_roots, on_host_paths=True)
