"""The podman engine's quirks, checked without podman (the suites run on a real one: every test parametrized over
the container backends has a ``podman`` case)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("docker")
from docker.types import LogConfig, Ulimit  # noqa: E402
from skyrl_sandbox.registry import get_backend  # noqa: E402
from skyrl_sandbox_podman import engine as podman_engine  # noqa: E402
from skyrl_sandbox_podman.engine import PodmanEngine  # noqa: E402


def test_the_backend_is_registered_as_a_container_backend_after_docker() -> None:
    backend = get_backend("podman")
    assert backend.strong and backend.runs_images and backend.has_machines
    assert isinstance(backend.engine, PodmanEngine) and backend.auto_rank > get_backend("docker").auto_rank


def test_a_read_only_worker_gets_its_ulimits_stated_and_podmans_writable_tmpfs_closed() -> None:
    settings = {"read_only": True, "tmpfs": {"/tmp": "rw,size=8m"}, "ulimits": [Ulimit(name="core", soft=0, hard=0)],
                "log_config": LogConfig(type="none")}
    adjusted = PodmanEngine().adjust_host_config(settings)
    assert {ulimit["Name"] for ulimit in adjusted["ulimits"]} == {"core", "nofile", "nproc"}
    assert adjusted["tmpfs"]["/tmp"] == "rw,size=8m"
    assert adjusted["tmpfs"]["/var/tmp"].startswith("ro,") and adjusted["tmpfs"]["/run"].startswith("ro,")
    assert adjusted["log_config"]["Type"] == "none" and settings["tmpfs"] == {"/tmp": "rw,size=8m"}  # not mutated


def test_a_machine_keeps_its_own_nofile_and_gets_a_size_capped_log_podman_has() -> None:
    settings = {"ulimits": [Ulimit(name="nofile", soft=64, hard=64)],
                "log_config": LogConfig(type="local", config={"max-size": "1m", "max-file": "2"})}
    adjusted = PodmanEngine().adjust_host_config(settings)
    assert [(u["Name"], u["Soft"]) for u in adjusted["ulimits"]][0] == ("nofile", 64)
    assert "/run" not in (adjusted.get("tmpfs") or {})  # a writable root keeps podman's /run
    assert adjusted["log_config"]["Type"] == "k8s-file" and adjusted["log_config"]["Config"] == {"max-size": "1m"}


def test_a_cmd_healthcheck_is_sent_as_one_quoted_shell_line() -> None:
    check = {"test": ["CMD", "python3", "-c", "import sys; sys.exit(0)"], "interval": 200_000_000}
    adjusted = PodmanEngine().adjust_healthcheck(check)
    assert adjusted == {"test": ["CMD-SHELL", "python3 -c 'import sys; sys.exit(0)'"], "interval": 200_000_000}
    shell = {"test": ["CMD-SHELL", "exit 1"]}
    assert PodmanEngine().adjust_healthcheck(shell) is shell


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def tag(self, image: str, repository: str, tag: str) -> None:
        self.calls.append(("tag", image, repository, tag))

    def remove_image(self, name: str) -> None:
        self.calls.append(("remove_image", name))


def test_an_import_is_tagged_as_asked_and_the_stray_latest_name_dropped() -> None:
    image = "sha256:" + "ab" * 32
    response = json.dumps({"status": image, "progress": "", "id": image}) + "\n"
    api = FakeApi()
    PodmanEngine().after_import(api, response, "localhost:5000/skyrl-sandbox-base:bookworm-1")
    assert api.calls == [("tag", image, "localhost:5000/skyrl-sandbox-base", "bookworm-1"),
                         ("remove_image", "localhost:5000/skyrl-sandbox-base:latest")]


@pytest.mark.parametrize(("missing", "words"), [
    ("podman", "podman is not installed"),
    ("catatonit", "catatonit, the init of podman's containers, is not installed"),
])
def test_what_is_missing_is_named(monkeypatch: pytest.MonkeyPatch, missing: str, words: str) -> None:
    monkeypatch.delenv("SKYRL_PODMAN_HOST", raising=False)
    monkeypatch.setattr(podman_engine.shutil, "which", lambda name: None if name == missing else f"/usr/bin/{name}")
    monkeypatch.setattr(podman_engine, "CATATONIT_PATHS", () if missing == "catatonit" else ("/",))
    assert words in (PodmanEngine().problem() or "")


def test_rootless_podman_on_cgroup_v1_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(podman_engine.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(podman_engine, "CATATONIT_PATHS", ("/",))
    monkeypatch.setattr(podman_engine.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(podman_engine, "CGROUP_V2", tmp_path / "absent")
    assert "rootless podman on cgroup v1 ignores memory, CPU and pids limits" in podman_engine.local_problem()


def test_an_oom_kill_is_found_in_the_kernel_log_by_the_containers_memory_cgroup(monkeypatch) -> None:
    cid = "cd" * 32
    records = [b"6,1,2,-;Memory cgroup stats for /libpod_parent/libpod-" + cid.encode() + b":\n",
               b"6,2,3,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/libpod_parent/libpod-" + cid.encode()
               + b",task_memcg=/libpod_parent/libpod-" + cid.encode() + b",task=python3,pid=9,uid=0\n"]

    def read(fd: int, size: int) -> bytes:
        if not records:
            raise BlockingIOError
        return records.pop(0)

    monkeypatch.setattr(podman_engine.os, "open", lambda path, flags: 99)
    monkeypatch.setattr(podman_engine.os, "read", read)
    monkeypatch.setattr(podman_engine.os, "close", lambda fd: None)
    assert podman_engine.kernel_logged_oom(cid)
    assert not podman_engine.kernel_logged_oom("ef" * 32)  # records used up: nothing more in the log
