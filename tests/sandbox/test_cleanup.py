"""No sandbox outlives its owner: SIGKILL a process holding 8 live boxes per backend, the next start sweeps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skyrl_sandbox.testing import require_backend

HOLDER = """
import asyncio, json, sys
from skyrl_sandbox.box import Box

async def main():
    boxes = [await Box.create(backend) for backend in sys.argv[1:] for _ in range(8)]
    for box in boxes:
        assert (await box.run(["true"])).ok
    print(json.dumps([{"pid": box._worker.pid, "dir": str(box._worker.host_dir),
                       "groups": [str(d) for d in (box._worker.cgroup.dirs if box._worker.cgroup else [])]}
                      for box in boxes]), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""
NEXT_START = """
import asyncio, sys
from skyrl_sandbox.box import run
for backend in sys.argv[1:]:
    print(asyncio.run(run(["echo", "next"], backend=backend)).stdout.decode().strip())
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def containers_of(owner: int) -> list[str]:
    from skyrl_sandbox.backends.docker.client import DOCKER
    from skyrl_sandbox.backends.docker.worker import OWNER_LABEL

    return [c.id for c in DOCKER.client().containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})]


def test_a_sigkilled_owner_leaves_nothing_behind_after_the_next_start():
    backends = ["bwrap", "docker", "subprocess"]
    for backend in backends:
        require_backend(backend)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, *backends], stdout=subprocess.PIPE, text=True)
    try:
        live = json.loads(holder.stdout.readline())
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert len(live) == 8 * len(backends)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(gone(box["pid"]) for box in live):
        time.sleep(0.05)
    assert all(gone(box["pid"]) for box in live), "sandbox processes outlived their owner"
    assert all(Path(box["dir"]).exists() for box in live)  # the owner had no chance to clean up
    assert len(containers_of(holder.pid)) == 8  # stopped with their owner's channel, not yet removed
    done = subprocess.run([sys.executable, "-c", NEXT_START, *backends], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["next"] * len(backends), done.stderr
    assert containers_of(holder.pid) == []
    assert not any(Path(box["dir"]).exists() for box in live)
    assert not any(Path(group).exists() for box in live for group in box["groups"])


def test_a_folder_that_cannot_be_removed_is_reported_not_ignored(tmp_path: Path, caplog):
    """remove_tree gives back the permissions a sandbox took away; what it still cannot remove (here a folder of
    another user's, as an unprivileged owner would meet one) is returned and logged, never passed over."""
    from skyrl_sandbox.dirs import remove_tree

    locked = tmp_path / "locked"
    (locked / "open" / "inner").mkdir(parents=True)
    (locked / "open" / "inner" / "f").write_text("x")
    for folder in (locked / "open" / "inner", locked / "open", locked):
        folder.chmod(0o500 if folder != locked / "open" / "inner" else 0o000)
    assert remove_tree(locked) is None and not locked.exists()

    if os.geteuid() != 0:
        return
    reachable = Path(tempfile.mkdtemp(prefix="skyrl-remove-"))  # pytest's tmp_path is root's alone
    reachable.chmod(0o755)
    other = reachable / "other"
    (other / "theirs").mkdir(parents=True)
    (other / "theirs" / "f").write_text("x")
    os.chown(other, 65534, 65534)  # ours as nobody; "theirs" stays root's
    probe = ("import logging, sys; logging.basicConfig(); sys.path.insert(0, sys.argv[2]); "
             "from skyrl_sandbox.dirs import remove_tree; print(remove_tree(__import__('pathlib').Path(sys.argv[1])))")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           probe, str(other), str(Path(__file__).resolve().parents[2] / "sandbox" / "src")],
                          capture_output=True, text=True, timeout=60)
    try:
        assert "Permission denied" in done.stdout and "could not remove the sandbox folder" in done.stderr, done
        assert (other / "theirs").exists()
    finally:
        shutil.rmtree(reachable)
