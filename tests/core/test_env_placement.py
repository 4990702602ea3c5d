"""Where env workers land on a real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``).

The cluster is kept off its head, as ``ray start --head --num-cpus 0 --resources "$(skyrl node-resources)"``
does: the head offers no CPU but advertises the sandbox backends (docker, bwrap); node A offers two CPUs and
nothing else, node B one CPU and docker. An env worker runs the env's Python, so every env runs on a node with
CPU that offers what the env declares, in every run (read back from inside the env, by node id); a cluster
where no node does is a config error naming what is missing, before any episode and never a hang.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import core_envs
import pytest
from core_envs import CountdownEnv
from skyrl_core import EnvSpec, StepResult, hookimpl, ray_cluster
from skyrl_core.factory import ConfigError
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # two Ray clusters start: about 30 s in all

#: what the head advertises though it offers no CPU, as `skyrl node-resources` would on it
HEAD_RESOURCES = {"docker": 8.0, "bwrap": 8.0}
TASKS = [{"id": f"c{i}", "n": i} for i in range(2)]  # two samples each: four episodes at once
RUNS = 3


class WhereEnv(CountdownEnv):
    """Countdown that says in each step's info which Ray node its Python ran on."""

    def take_action(self, action: str) -> StepResult:
        result = super().take_action(action)
        result.info["node"] = ray.get_runtime_context().get_node_id()
        return result


class WherePlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="where", entry_point="test_env_placement:WhereEnv", description="reports its node"))


@pytest.fixture(autouse=True)
def plugins(register_skyrl_plugin):
    register_skyrl_plugin(WherePlugin(), name="where-env")


@pytest.fixture(scope="module", autouse=True)
def picklable() -> None:
    from ray import cloudpickle  # Ray's own copy pickles what reaches its workers

    for module in (core_envs, sys.modules[__name__]):  # test modules are not importable in Ray's workers
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer("chatml")


def generator(tokenizer, **options: Any) -> MultiTurnGenerator:
    """Four episodes of two turns at once, each in its own env worker (``envs_per_worker=1``)."""
    config = GeneratorConfig(n_samples_per_prompt=2, max_tokens_per_turn=16, max_context_length=1024,
                             env_placement="ray", envs_per_worker=1, **options)
    engine = ScriptedEngine(tokenizer, default=lambda ids: "done" if "go on" in tokenizer.decode(ids) else "again")
    return MultiTurnGenerator(config, engine=engine, tokenizer=tokenizer, env_id="where", env_config={"max_turns": 3})


async def play(tokenizer, **options: Any) -> tuple[list[str], list[str]]:
    """One batch: the node each step's env ran on (said by the env), and the node of each env worker started."""
    gen = generator(tokenizer, **options)
    try:
        batch = await gen.generate(TASKS)
        workers = [worker.node_id for worker in gen.env_pool.workers]
    finally:
        gen.close()
    assert all(t.error is None and t.reward == 1.0 for t in batch.trajectories), [t.error for t in batch.trajectories]
    return [turn.info["node"] for t in batch.trajectories for turn in t.turns], workers


@pytest.fixture(scope="class")
def nodes() -> Iterator[dict[str, str]]:
    """The head (no CPU, sandbox resources), A (2 CPUs) and B (1 CPU, docker): their Ray node ids."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "resources": HEAD_RESOURCES})
    try:
        a = cluster.add_node(num_cpus=2)
        b = cluster.add_node(num_cpus=1, resources={"docker": 4})
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield {"head": cluster.head_node.node_id, "a": a.node_id, "b": b.node_id}
    finally:
        ray_cluster.disconnect(True)
        cluster.shutdown()


@pytest.fixture(scope="class")
def head_only() -> Iterator[None]:
    """A head started with no CPU (but sandbox resources) that no worker node joined."""
    ray.init(num_cpus=0, resources=HEAD_RESOURCES, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray_cluster.disconnect(True)


class TestAClusterKeptOffItsHead:
    async def test_envs_that_declare_nothing_run_only_on_nodes_with_cpu_in_every_run(self, nodes, tokenizer):
        for _ in range(RUNS):
            ran_on, workers = await play(tokenizer)
            assert len(ran_on) == 8 and set(ran_on) <= {nodes["a"], nodes["b"]}
            assert Counter(workers) == {nodes["a"]: 2, nodes["b"]: 2}  # spread over both, none on the head

    async def test_a_docker_env_runs_only_on_the_node_with_cpu_and_docker(self, nodes, tokenizer):
        for _ in range(RUNS):  # the head advertises more docker slots than B, but runs no Python for envs
            ran_on, workers = await play(tokenizer, env_resources={"docker": 1})
            assert set(ran_on) == {nodes["b"]} and workers == [nodes["b"]] * 4

    async def test_an_env_that_reserves_cpu_gets_no_more_workers_on_a_node_than_its_cores(self, nodes, tokenizer):
        ran_on, workers = await play(tokenizer, env_resources={"CPU": 1})
        assert set(ran_on) <= {nodes["a"], nodes["b"]}
        assert Counter(workers) == {nodes["a"]: 2, nodes["b"]: 1}  # four episodes, three cores: one waits

    @pytest.mark.parametrize(("needs", "reason"), [
        ({"bwrap": 1}, r"no live node of the cluster offers them together with CPU.*without CPU.*bwrap=8"),
        ({"tpu_sandbox": 1}, r"tpu_sandbox=1 per env worker but no live node.*skyrl node-resources"),
    ], ids=["only-on-the-cpu-less-head", "on-no-node"])
    async def test_an_env_whose_resource_no_node_with_cpu_offers_is_a_config_error(self, nodes, tokenizer, needs,
                                                                                   reason):
        gen = generator(tokenizer, env_resources=needs)
        with pytest.raises(ConfigError, match=reason):
            await gen.generate(TASKS)

    async def test_the_orphan_sweep_runs_only_on_nodes_with_cpu(self, nodes, tokenizer):
        gen = generator(tokenizer)
        try:
            await gen.generate(TASKS[:1])
            swept = gen.env_pool.sweep_nodes()
        finally:
            gen.close()
        assert set(swept) == {nodes["a"], nodes["b"]}


@pytest.mark.usefixtures("head_only")
class TestAClusterWithNoCpu:
    @pytest.mark.parametrize("needs", [None, {"docker": 1}], ids=["declares-nothing", "declares-docker"])
    async def test_no_env_runs_and_the_error_says_no_node_offers_cpu(self, tokenizer, needs):
        gen = generator(tokenizer, env_resources=needs)
        with pytest.raises(ConfigError, match=r"no live node of the Ray cluster offers CPU.*--num-cpus 0"):
            await gen.generate(TASKS)
