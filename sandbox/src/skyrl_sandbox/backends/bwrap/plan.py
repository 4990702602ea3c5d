"""bubblewrap's command lines: the shared namespace flags, and a worker's whole plan."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ...launch import (
    INSIDE_INBOX,
    INSIDE_LIB,
    LaunchPlan,
    WorkerProgram,
    clean_env,
    python_args,
    python_executable,
    spawn_settings,
)
from ...limits import Limits

_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def bwrap_base_argv(uid: int, hostname: str) -> list[str]:
    """bubblewrap with fresh namespaces, no capabilities, ``uid`` inside, and the host's system folders read-only."""
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--cap-drop", "ALL", "--uid", str(uid), "--gid", str(uid),
            "--hostname", hostname, "--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def plan_bwrap(program: WorkerProgram, host_dir: Path, limits: Limits) -> LaunchPlan:
    argv = [*bwrap_base_argv(1000, "sandbox"), "--new-session",
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.realpath(sys.base_prefix)
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    # /proc too: the sandbox's uid maps to the host's, and /proc files (sysctls such as kernel.core_pattern,
    # sysrq-trigger) check only the uid, so a host running as root would otherwise let model code write them.
    read_only = ["/proc", "/dev", "/"]
    site_packages = os.path.join(os.path.dirname(os.__file__), "site-packages")
    if os.path.isdir(site_packages):
        argv += ["--tmpfs", site_packages]  # hide the base install's third-party packages
        read_only.insert(0, site_packages)
    inside_packages = []
    for name, folder in program.all_packages.items():
        argv += ["--ro-bind", str(folder), f"{INSIDE_LIB}/{name}"]
        inside_packages.append(f"{INSIDE_LIB}/{name}")
    argv += ["--ro-bind", str(host_dir / "inbox"), INSIDE_INBOX,
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(limits.tmp_size_mb * 2**20), "--tmpfs", "/tmp"]
    for path in program.read_only:  # after the tmpfs /tmp, which would hide a path under /tmp
        argv += ["--ro-bind", path, path]
    # Every tmpfs but /tmp read-only (/dev/shm included): memory in them would count against no limit.
    for path in read_only:
        argv += ["--remount-ro", path]
    argv += ["--chdir", "/tmp", "--"]
    spawn = spawn_settings(limits, None)
    return LaunchPlan(argv=argv + python_args(program, python_executable(), [INSIDE_LIB], spawn), cwd=str(host_dir),
                      env=clean_env("/tmp"), inside_tmp="/tmp", inside_inbox=INSIDE_INBOX,
                      inside_read_roots=(*inside_packages, *program.read_only, INSIDE_INBOX),
                      signals_as_status=True)
