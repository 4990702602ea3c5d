"""generator.env_placement=ray on a real local Ray: envs in worker actors play exactly the episodes local
envs play, sub-calls come back to the generator, lost and silent workers cost retries (never a hung batch),
a group whose retries run out is dropped with its reason, and what a dead worker left is swept."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import core_envs
import pytest
from core_envs import CountdownEnv, TestEnvsPlugin
from skyrl_core import EnvSpec, StepResult, hookimpl, ray_cluster
from skyrl_core.env import EpisodeEnv
from skyrl_core.env_pool import RayEnvPool, RemoteEnv
from skyrl_core.factory import ConfigError
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.testing.scripted_engine import GatedEngine, ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer

ray = pytest.importorskip("ray")


class HangingEnv(CountdownEnv):
    """Never answers a step of a task with ``hang: True`` (a wedged container command, say)."""

    def take_action(self, action: str) -> StepResult:
        if self.task.get("hang"):
            time.sleep(3600)
        return super().take_action(action)


class SubcallEnv(CountdownEnv):
    """Asks its sub-call handler once per step and shows the answer (as the RLM's REPL does)."""

    subcall_handler: Any = None

    async def atake_action(self, action: str) -> StepResult:
        first = await self.subcall_handler("llm_query", {"prompt": f"one {action}"})
        second = await self.subcall_handler("llm_query", {"prompt": f"two {action}"})
        done = "done" in action
        return StepResult([] if done else [{"role": "user", "content": f"{first} | {second}"}], float(done), done,
                          False, {"answers": [first, second]})


class WorkerTestEnvs:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="hanging", entry_point="test_env_workers:HangingEnv", description="hangs on demand"))
        register(EnvSpec(id="subcalling", entry_point="test_env_workers:SubcallEnv", description="sub-calls"))


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    from ray import cloudpickle  # Ray's own copy pickles what reaches its workers

    for module in (core_envs, sys.modules[__name__]):  # test modules are not importable in Ray's workers
        cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=2, resources={"bwrap": 8}, include_dashboard=False, log_to_driver=False)
    yield
    ray_cluster.disconnect(True)


@pytest.fixture(autouse=True)
def plugins(register_skyrl_plugin):
    register_skyrl_plugin(TestEnvsPlugin(), name="core-envs")
    register_skyrl_plugin(WorkerTestEnvs(), name="worker-envs")


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer("chatml")


def generator(tokenizer, engine, env_id="countdown", **options) -> MultiTurnGenerator:
    config = GeneratorConfig(n_samples_per_prompt=2, max_tokens_per_turn=32, max_context_length=1024, **options)
    return MultiTurnGenerator(config, engine=engine, tokenizer=tokenizer, env_id=env_id, env_config={"max_turns": 3})


def countdown(tokenizer) -> Any:
    """Says "again" on the first turn and "done" on the second: two turns an episode."""
    def reply(prompt_ids: list[int]) -> str:
        return "done" if "go on" in tokenizer.decode(prompt_ids) else "again"

    return reply


def played(batch) -> list[tuple[Any, ...]]:
    return [(t.group_id, t.sample_index, t.response_ids, t.loss_mask, t.reward, t.stop_reason, t.error,
             [turn.observation for turn in t.turns]) for t in batch.trajectories]


TASKS = [{"id": f"c{i}", "n": i} for i in range(4)]


async def test_remote_envs_play_exactly_the_episodes_local_envs_play(tokenizer):
    local = await generator(tokenizer, ScriptedEngine(tokenizer, default=countdown(tokenizer))).generate(TASKS)
    gen = generator(tokenizer, ScriptedEngine(tokenizer, default=countdown(tokenizer)), env_placement="ray",
                    envs_per_worker=3)
    try:
        remote = await gen.generate(TASKS)
    finally:
        gen.close()
    assert played(remote) == played(local)
    assert all(len(t.turns) == 2 and t.reward == 1.0 for t in remote.trajectories)
    node = ray.get_runtime_context().get_node_id()
    assert {t.env_node for t in remote.trajectories} == {node} and {t.env_node for t in local.trajectories} == {None}
    assert [t.metrics["turns_seen"] for t in remote.trajectories] == [t.metrics["turns_seen"] for t in local.trajectories]
    assert remote.metrics["ray/env_workers"] == 3.0  # 8 episodes, 3 envs per worker
    assert remote.metrics["ray/episodes_retried"] == 0.0 and remote.metrics["ray/workers_lost"] == 0.0


async def play(env: EpisodeEnv, actions: list[str]) -> tuple[Any, ...]:
    """One episode through the interface the generator plays every env through, wherever the env runs."""
    prompt, info = await env.areset(seed=0, options={"task": TASKS[1]})
    steps = [await env.astep(action) for action in actions]
    node = env.node_id
    return prompt, info, steps, await env.afinish(), node


async def test_a_local_and_a_ray_hosted_env_play_one_episode_alike_through_one_interface():
    config = CountdownEnv.config_class(max_turns=3)
    local = await play(CountdownEnv(task=TASKS[1], config=config), ["again", "done"])
    pool = RayEnvPool(CountdownEnv, config, envs_per_worker=1, max_workers=1)
    try:
        remote = await play(RemoteEnv(pool, TASKS[1]), ["again", "done"])
    finally:
        pool.close()
    assert remote[:4] == local[:4]
    assert local[2][-1].terminated and local[3] == {"turns_seen": 2.0}
    assert local[4] is None and remote[4] == ray.get_runtime_context().get_node_id()


async def test_sub_calls_of_a_remote_env_are_answered_by_the_generator(tokenizer):
    asked: list[tuple[str, str]] = []

    async def handler(method: str, params: dict[str, Any]) -> str:
        asked.append((method, params["prompt"]))
        await asyncio.sleep(0.01)  # the answer takes engine time here, never in the worker
        return f"answer to {params['prompt']}"

    class Handled(MultiTurnGenerator):
        def new_env(self, task):
            env = super().new_env(task)
            env.subcall_handler = handler
            return env

    engine = ScriptedEngine(tokenizer, ["again", "done"])
    gen = Handled(GeneratorConfig(n_samples_per_prompt=1, env_placement="ray"), engine=engine, tokenizer=tokenizer,
                  env_id="subcalling", env_config={"max_turns": 3})
    try:
        batch = await gen.generate([TASKS[0]])
    finally:
        gen.close()
    episode = batch.trajectories[0]
    assert episode.error is None and episode.reward == 1.0
    assert asked == [("llm_query", "one again"), ("llm_query", "two again"), ("llm_query", "one done"),
                     ("llm_query", "two done")]
    assert episode.turns[0].observation[0]["content"] == "answer to one again | answer to two again"
    assert episode.turns[1].info["answers"] == ["answer to one done", "answer to two done"]


async def test_a_sub_call_handler_that_raises_fails_the_step_as_it_does_locally(tokenizer):
    async def handler(method: str, params: dict[str, Any]) -> str:
        raise ValueError(f"engine gone while answering {params['prompt']!r}")

    class Handled(MultiTurnGenerator):
        def new_env(self, task):
            env = super().new_env(task)
            env.subcall_handler = handler
            return env

    batches = {}
    for placement in ("local", "ray"):
        gen = Handled(GeneratorConfig(n_samples_per_prompt=1, env_placement=placement), tokenizer=tokenizer,
                      engine=ScriptedEngine(tokenizer, default="again"), env_id="subcalling",
                      env_config={"max_turns": 3})
        try:
            batches[placement] = await gen.generate([TASKS[0]])
        finally:
            gen.close()
    assert played(batches["ray"]) == played(batches["local"])
    episode = batches["ray"].trajectories[0]
    assert episode.stop_reason == "env_error" and episode.error == "ValueError: engine gone while answering 'one again'"


async def start_and_wait(gen, engine, tasks, held):
    """Start ``gen.generate(tasks)`` and return once ``held`` episodes wait on the engine with a live env."""
    task = asyncio.ensure_future(gen.generate(tasks))
    deadline = time.monotonic() + 120
    while engine.held < held:
        assert time.monotonic() < deadline and not task.done(), f"only {engine.held} of {held} episodes got there"
        await asyncio.sleep(0.05)
    return task


async def test_a_killed_worker_costs_retries_on_another_worker_and_nothing_else(tokenizer):
    local = await generator(tokenizer, ScriptedEngine(tokenizer, default=countdown(tokenizer))).generate(TASKS)
    engine = GatedEngine(tokenizer, marker="go on", default=countdown(tokenizer))
    gen = generator(tokenizer, engine, env_placement="ray", envs_per_worker=2, max_env_workers=4)
    try:
        running = await start_and_wait(gen, engine, TASKS, 8)  # every episode reset, its first turn in the engine
        victim = gen.env_pool.workers[0]
        hosted = victim.leases
        ray.kill(victim.actor, no_restart=True)
        engine.gate.set()
        batch = await asyncio.wait_for(running, 120)
    finally:
        gen.close()
    assert played(batch) == played(local)  # replayed from the start with the same seeds
    assert batch.metrics["ray/episodes_retried"] == float(hosted) == 2.0
    assert batch.metrics["ray/workers_lost"] == 1.0 and batch.metrics["ray/groups_dropped"] == 0.0
    assert batch.metrics["rollout/errors"] == 0.0


async def test_a_group_whose_retries_run_out_is_dropped_with_the_reason(tokenizer):
    engine = GatedEngine(tokenizer, marker="go on", default=countdown(tokenizer))
    gen = generator(tokenizer, engine, env_placement="ray", envs_per_worker=2, max_env_retries=0)
    try:
        running = await start_and_wait(gen, engine, TASKS, 8)
        victim = gen.env_pool.workers[0]
        ray.kill(victim.actor, no_restart=True)
        engine.gate.set()
        batch = await asyncio.wait_for(running, 120)
    finally:
        gen.close()
    lost = [t for t in batch.trajectories if t.stop_reason == "env_worker_lost"]
    assert len(lost) == 2 and all("was lost" in t.error for t in lost)
    dropped_groups = {t.group_id for t in lost}
    for t in batch.trajectories:
        if t.group_id in dropped_groups and t.stop_reason != "env_worker_lost":
            assert t.error.startswith(f"group dropped: an episode of task {t.group_id!r} lost its env worker 1 time")
            assert "generator.max_env_retries=0" in t.error
        elif t.group_id not in dropped_groups:
            assert t.error is None and t.reward == 1.0
    assert batch.metrics["ray/groups_dropped"] == float(len(dropped_groups)) >= 1.0
    assert batch.metrics["ray/episodes_retried"] == 0.0


async def test_a_silent_worker_is_timed_out_killed_and_replaced(tokenizer):
    tasks = [{"id": "stuck", "n": 1, "hang": True}, {"id": "fine", "n": 2}]
    engine = ScriptedEngine(tokenizer, default=countdown(tokenizer))
    gen = generator(tokenizer, engine, env_id="hanging", env_placement="ray", envs_per_worker=1,
                    env_call_timeout=2.0, max_env_retries=1)
    try:
        batch = await asyncio.wait_for(gen.generate(tasks), 120)
    finally:
        gen.close()
    stuck = [t for t in batch.trajectories if t.group_id == "stuck"]
    fine = [t for t in batch.trajectories if t.group_id == "fine"]
    assert all(t.stop_reason == "env_worker_lost" and "no answer to step within 2 s" in t.error for t in stuck)
    assert all(t.error is None and t.reward == 1.0 for t in fine)
    assert batch.metrics["ray/workers_lost"] == 4.0  # each stuck episode, then its retry
    assert batch.metrics["ray/episodes_retried"] == 2.0 and batch.metrics["ray/groups_dropped"] == 1.0


async def test_an_env_needing_a_resource_no_node_offers_is_a_config_error(tokenizer):
    gen = generator(tokenizer, ScriptedEngine(tokenizer, default="done"), env_placement="ray",
                    env_resources={"tpu_sandbox": 1})
    with pytest.raises(ConfigError, match="tpu_sandbox.*no live node.*skyrl node-resources"):
        await gen.generate(TASKS[:1])


async def test_workers_stay_within_envs_per_worker_and_max_env_workers(tokenizer):
    import psutil

    engine = GatedEngine(tokenizer, marker="go on", default=countdown(tokenizer))
    gen = generator(tokenizer, engine, env_placement="ray", envs_per_worker=2, max_env_workers=2)
    try:
        running = await start_and_wait(gen, engine, TASKS, 4)  # 8 episodes, room for 4 at a time
        await asyncio.sleep(0.5)
        assert [w.leases for w in gen.env_pool.workers] == [2, 2]
        assert len(engine.calls) == 4 and engine.held == 4  # the other four wait for a slot, not for the engine
        engine.gate.set()
        batch = await asyncio.wait_for(running, 120)
        processes = [psutil.Process(w.pid) for w in gen.env_pool.workers]
    finally:
        gen.close()
    assert all(t.error is None for t in batch.trajectories) and batch.metrics["ray/env_workers"] == 2.0
    # closing the generator kills its workers (Ray kills an actor asynchronously: a call made at once may still
    # be answered, so wait for the processes to end)
    _, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive


async def test_a_dead_workers_sandboxes_are_swept_from_its_node(tokenizer):
    """A SQL env's bwrap sandbox (host folder, cgroups) in a worker that is SIGKILLed is removed by the sweep."""
    import psutil

    engine = GatedEngine(tokenizer, marker="turns left", default="<sql>SELECT 1</sql>")
    gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, env_placement="ray", max_env_retries=0,
                                             max_tokens_per_turn=32, max_context_length=4096),
                             engine=engine, tokenizer=tokenizer, env_id="sql", env_config={"max_turns": 2})
    from skyrl_sql.env import SQLEnv

    try:  # the first turn runs a query, so the worker holds a live sandbox while the second waits on the engine
        running = asyncio.ensure_future(gen.generate(SQLEnv.load_dataset("train")[:1]))
        deadline = time.monotonic() + 120
        while engine.held < 1:
            assert time.monotonic() < deadline and not running.done(), "the episode never reached its second turn"
            await asyncio.sleep(0.05)
        worker = gen.env_pool.workers[0]
        folders = list(Path("/tmp").glob(f"skyrl-sandboxes-{worker.pid}-*"))
        assert folders, "the worker's sandbox folder exists while its episode runs"
        psutil.Process(worker.pid).kill()  # as an OOM kill or a lost node would: nothing is cleaned up
        engine.gate.set()
        batch = await asyncio.wait_for(running, 120)
        assert batch.metrics["ray/workers_lost"] == 1.0
        deadline = time.monotonic() + 60
        while any(f.exists() for f in folders) and time.monotonic() < deadline:
            gen.env_pool.sweep_nodes()
            await asyncio.sleep(0.5)
    finally:
        gen.close()
    assert not any(f.exists() for f in folders)
