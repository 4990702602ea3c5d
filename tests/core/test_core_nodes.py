"""This machine as a Ray node: the resources it advertises for env workers and the orphan sweep, both
asked of plugins (skyrl-sandbox answers for the sandbox backends); a plugin that raises is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from skyrl_core import hookimpl
from skyrl_core.nodes import node_resources, sweep_orphans
from skyrl_sandbox import registered


class BigMachine:
    @hookimpl
    def node_resources(self):
        return {"gpu_sandbox": 2, "bwrap": 1000}

    @hookimpl
    def sweep_orphans(self):
        return {"vms": 3}


class Broken:
    @hookimpl
    def node_resources(self):
        raise OSError("cannot probe")

    @hookimpl
    def sweep_orphans(self):
        raise OSError("cannot sweep")


def test_the_sandbox_plugin_offers_a_slot_per_core_of_each_backend_that_works(skyrl_plugin_manager):
    offered = node_resources(skyrl_plugin_manager)
    working = {b.ray_resource for b in registered().values() if b.ray_resource and b.problem() is None}
    assert set(offered) == working and "subprocess" not in offered
    assert all(amount == float(os.cpu_count()) for amount in offered.values())


def test_plugins_merge_the_larger_amount_wins_and_a_raising_plugin_is_skipped(register_skyrl_plugin, caplog):
    register_skyrl_plugin(BigMachine(), name="big")
    register_skyrl_plugin(Broken(), name="broken")
    offered = node_resources()
    assert offered["gpu_sandbox"] == 2.0 and offered["bwrap"] == 1000.0
    swept = sweep_orphans()
    assert swept["big/vms"] == 3 and "skyrl-sandbox/folders" in swept
    assert "plugin broken: its node_resources hook raised OSError: cannot probe" in caplog.text
    assert "plugin broken: its sweep_orphans hook raised OSError: cannot sweep" in caplog.text


def test_a_dead_owners_sandbox_folder_is_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    folder = Path("/tmp") / f"skyrl-sandboxes-{pid}-test"
    (folder / "worker-x").mkdir(parents=True)
    swept = sweep_orphans()
    assert not folder.exists() and swept["skyrl-sandbox/folders"] >= 1


def test_skyrl_node_resources_prints_json_for_ray_start(skyrl_cli):
    result = skyrl_cli("node-resources")
    assert result.exit_code == 0
    assert json.loads(result.output) == node_resources()


def test_sandbox_doctor_prints_the_same_resources():
    done = subprocess.run([sys.executable, "-m", "skyrl_sandbox.cli", "doctor", "--ray-resources"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == node_resources()
