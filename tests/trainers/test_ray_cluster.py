"""Env workers on a real multi-node Ray cluster on this machine: `ray start --head` plus two `ray start
--address` worker nodes with their own temp dirs and different resources (node A offers docker and bwrap,
node B only bwrap, the head nothing). `skyrl run` places each env only on nodes that offer its resource
(read back from the trajectories' node ids), and a node whose raylet is killed in the middle of a step
costs retries on the other node, counted in the metrics, with nothing of its sandboxes left after the sweep.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from skyrl_core import ray_cluster
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.testing.scripted_engine import GatedEngine
from skyrl_core.testing.tokenizers import make_tokenizer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@dataclass
class Cluster:
    address: str
    root: Path
    nodes: dict[str, str]  # "head", "a", "b" -> Ray node id
    ports: dict[str, int]  # "a", "b" -> node manager port (names their raylet)

    def raylet(self, name: str) -> psutil.Process:
        flag = f"--node_manager_port={self.ports[name]}"
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if cmdline and cmdline[0].endswith("raylet") and flag in cmdline:
                return proc
        raise LookupError(f"no raylet with {flag}")


def free_port() -> int:
    from skyrl_trainers.workers import free_port as port

    return port()


def ray_start(env: dict[str, str], *args: str) -> None:
    subprocess.run([str(BIN / "ray"), "start", "--disable-usage-stats", "--num-cpus=1", *args], env=env, check=True,
                   capture_output=True, text=True, timeout=180)


def stop(root: Path) -> None:
    """Kill every process of this cluster: those whose command line names its folder, and their children."""
    procs = [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]
    everything = {p.pid: p for proc in procs for p in [proc, *proc.children(recursive=True)]}
    for proc in everything.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(everything.values()), timeout=30)


@pytest.fixture(scope="module")
def cluster():
    # A short folder: Ray's unix socket paths live under it (at most 107 characters).
    root = Path(tempfile.mkdtemp(prefix="skyrl-ray-", dir="/tmp"))
    # Ray's token authentication, as on a real cluster: every node and the driver use the one token of this
    # machine (~/.ray/auth_token, made if missing). The nodes are told RAY_AUTH_MODE=token. This process reads
    # that variable only when Ray is imported, and a ray.init given an address never turns token mode on (a user
    # sets RAY_AUTH_MODE=token before starting the driver); a local ray.init does, so one runs first when the
    # variable is unset. Turning authentication off instead would break this process's own Ray sessions: a
    # driver that ran a token-mode local Ray cannot own actors on a no-auth cluster.
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=env, capture_output=True, timeout=60)
    port, ports = free_port(), {"a": free_port(), "b": free_port()}
    address = f"127.0.0.1:{port}"
    try:
        ray_start(env, "--head", f"--port={port}", f"--temp-dir={root}/head", "--include-dashboard=false")
        ray_start(env, f"--address={address}", f"--temp-dir={root}/a", f"--node-manager-port={ports['a']}",
                  '--resources={"docker": 4, "bwrap": 4}')
        ray_start(env, f"--address={address}", f"--temp-dir={root}/b", f"--node-manager-port={ports['b']}",
                  '--resources={"bwrap": 4}')
        if not os.environ.get("RAY_AUTH_MODE"):  # a local ray.init turns this process's token mode on
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
            ray_cluster.disconnect(True)
        ray.init(address=address, log_to_driver=False)
        nodes = {}
        deadline = time.monotonic() + 60
        while len(nodes) < 3 and time.monotonic() < deadline:
            for node in ray.nodes():
                if node["Alive"]:
                    have = node["Resources"]
                    name = "a" if "docker" in have else "b" if "bwrap" in have else "head"
                    nodes[name] = node["NodeID"]
            time.sleep(0.2)
        assert set(nodes) == {"head", "a", "b"}, f"the cluster did not come up: {ray.nodes()}"
        yield Cluster(address, root, nodes, ports)
    finally:
        ray_cluster.disconnect(True)
        stop(root)
        shutil.rmtree(root, ignore_errors=True)


def skyrl_run(cluster: Cluster, out: Path, env_id: str, *overrides: str) -> list[dict]:
    command = [str(BIN / "skyrl"), "run", "--env", env_id, "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "trainer.steps=1", "trainer.batch_size=2", "trainer.eval_samples=0", "trainer.samples_per_step=8",
               "trainer.export=false", "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=16",
               "generator.env_placement=ray", "generator.envs_per_worker=1", f"run.ray_address={cluster.address}",
               f"run.output_dir={out}", "run.console=false", "env.max_turns=1", *overrides]
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_skyrl_run_places_each_env_only_on_nodes_that_offer_its_resource(cluster, tmp_path):
    docker_episodes = skyrl_run(cluster, tmp_path / "harbor", "harbor_terminal", "env.backend=docker")
    bwrap_episodes = skyrl_run(cluster, tmp_path / "sql", "sql")
    assert len(docker_episodes) == len(bwrap_episodes) == 4
    assert {e["env_node"] for e in docker_episodes} == {cluster.nodes["a"]}  # only A offers docker
    # bwrap: A and B both offer it, the head nothing; four one-env workers spread two and two
    assert sorted(e["env_node"] for e in bwrap_episodes) == sorted([cluster.nodes["a"], cluster.nodes["b"]] * 2)
    metrics = [json.loads(line) for line in (tmp_path / "sql" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["ray/env_workers"] == 4.0 and metrics[-1]["ray/workers_lost"] == 0.0


def test_a_node_killed_mid_step_costs_retries_on_the_other_node_and_leaves_nothing(cluster):
    from skyrl_sql.env import SQLEnv

    tokenizer = make_tokenizer("chatml")
    engine = GatedEngine(tokenizer, marker="turns left", default="<sql>SELECT 1</sql>")
    config = GeneratorConfig(n_samples_per_prompt=2, env_placement="ray", envs_per_worker=1, max_tokens_per_turn=32,
                             max_context_length=4096)
    gen = MultiTurnGenerator(config, engine=engine, tokenizer=tokenizer, env_id="sql", env_config={"max_turns": 2})
    b_workers: list[int] = []

    async def play():
        running = asyncio.ensure_future(gen.generate(SQLEnv.load_dataset("train")[:2]))
        deadline = time.monotonic() + 180
        while engine.held < 4:  # every episode ran a query (a live sandbox) and waits for its second turn
            assert time.monotonic() < deadline and not running.done(), (
                f"{engine.held} of 4 episodes reached their second turn: "
                f"{running.result().trajectories if running.done() else 'still running'}")
            await asyncio.sleep(0.05)
        on_b = [w for w in gen.env_pool.workers if w.node_id == cluster.nodes["b"]]
        assert len(on_b) == 2, "two of the four one-env workers run on node B"
        b_workers.extend(w.pid for w in on_b)
        cluster.raylet("b").kill()  # the node goes away in the middle of the step
        psutil.wait_procs([psutil.Process(pid) for pid in b_workers if psutil.pid_exists(pid)], timeout=60)
        engine.gate.set()
        return await asyncio.wait_for(running, 300)

    try:
        batch = asyncio.run(play())
        folders = [f for pid in b_workers for f in Path(tempfile.gettempdir()).glob(f"skyrl-sandboxes-{pid}-*")]
        deadline = time.monotonic() + 60
        while folders and time.monotonic() < deadline:  # the sweep runs on every live node after a loss
            gen.env_pool.sweep_nodes()
            folders = [f for f in folders if f.exists()]
            time.sleep(0.5)
    finally:
        gen.close()
    assert all(t.error is None and t.stop_reason != "env_worker_lost" for t in batch.trajectories)
    assert {t.env_node for t in batch.trajectories} == {cluster.nodes["a"]}  # B's two episodes replayed on A
    assert batch.metrics["ray/episodes_retried"] == 2.0 and batch.metrics["ray/workers_lost"] == 2.0
    assert batch.metrics["ray/groups_dropped"] == 0.0
    assert folders == [], "the killed node's sandbox folders were swept"
    assert not [pid for pid in b_workers if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_skyrl_run_with_two_engine_replicas_on_the_cluster(cluster, tmp_path):
    """Engine replicas and env workers join the same cluster through run.ray_address; both replicas serve."""
    skyrl_run(cluster, tmp_path / "replicas", "reverse_text", "trainer.steps=2", "trainer.engine_placement=ray",
              "engine.replicas=2", "env.max_turns=2")
    metrics = [json.loads(line) for line in (tmp_path / "replicas" / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "engine/replicas_alive" in m][-1]
    assert last["engine/replicas_alive"] == 2.0
    assert last["engine/replica0_requests"] > 0 and last["engine/replica1_requests"] > 0
    assert last["engine/replica0_failed"] == 0.0 and last["engine/replica1_failed"] == 0.0
