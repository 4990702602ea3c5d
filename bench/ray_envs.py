"""Env workers on Ray (generator.env_placement=ray): throughput against the number of workers, and the
per-step cost of a remote env, each beside local placement measured in the same run.

The env is latency-bound, as container commands are: every step waits ``STEP_MS`` on an external resource
(``asyncio.sleep``), never on the CPU, so throughput is set by how many envs are live at once. With ``N``
workers of ``ENVS_PER_WORKER`` envs each, ``N x ENVS_PER_WORKER`` episodes are in flight; the local row plays
the same concurrency in the generator's own process. Scaling efficiency is throughput / (N x one worker's);
the target is >= 0.8 at 4 workers. The overhead rows play one env step at a time (a zero-latency env) and
compare the p50 of a remote step with a local one (target: <= 2 ms more).

Run: python bench/ray_envs.py   (starts a local Ray with 4 CPUs; about a minute)
"""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.table import Table
from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.env_pool import RayEnvPool, RemoteEnv
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.registry import Provider
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer
from timing import percentile, timed

STEP_MS = 50.0
TURNS = 4
ENVS_PER_WORKER = 8
WORKERS = (1, 2, 4)
ROUNDS = 3  # episodes per env slot, so each configuration runs for a while
OVERHEAD_STEPS = 300


class LatencyEnv(TextEnv):
    """``task["turns"]`` steps (default ``TURNS``), each waiting ``task["step_ms"]`` on an outside resource;
    reward 1 at the end."""

    async def atake_action(self, action: str) -> StepResult:
        await asyncio.sleep(self.task.get("step_ms", STEP_MS) / 1000)
        done = self.turn >= self.task.get("turns", TURNS)
        return StepResult([] if done else [{"role": "user", "content": "ok"}], float(done), done, False, {})


class BenchPlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="bench_latency", entry_point=f"{__name__}:LatencyEnv"))


def episodes_per_second(tokenizer, placement: str, concurrency: int, workers: int) -> float:
    engine = ScriptedEngine(tokenizer, default="go")
    config = GeneratorConfig(n_samples_per_prompt=1, max_turns=TURNS, max_concurrency=concurrency,
                             max_tokens_per_turn=8, env_placement=placement, envs_per_worker=ENVS_PER_WORKER,
                             max_env_workers=max(workers, 1))
    gen = MultiTurnGenerator(config, engine=engine, tokenizer=tokenizer, env_id="bench_latency",
                             env_config={"max_turns": TURNS})
    try:
        asyncio.run(gen.generate([{"prompt": "warm-up"}] * concurrency))  # workers started, envs imported
        tasks = [{"prompt": f"task {i}", "id": f"t{i}"} for i in range(concurrency * ROUNDS)]
        started = time.perf_counter()
        batch = asyncio.run(gen.generate(tasks))
        elapsed = time.perf_counter() - started
    finally:
        gen.close()
    assert all(t.error is None and t.reward == 1.0 for t in batch), "benchmark episodes must not fail"
    return len(tasks) / elapsed


async def step_latencies(remote: bool) -> list[float]:
    task = {"prompt": "step", "step_ms": 0.0, "turns": 10**9}
    if remote:
        pool = RayEnvPool(LatencyEnv, LatencyEnv.config_class(max_turns=10**6), envs_per_worker=1, max_workers=1)
        env = RemoteEnv(pool, task)
        await env.areset(seed=0)
    else:
        pool, env = None, LatencyEnv(task=task, config={"max_turns": 10**6})
        env.reset(seed=0)
    try:
        await timed(20, lambda: env.astep("go"))  # warm-up
        return await timed(OVERHEAD_STEPS, lambda: env.astep("go"))
    finally:
        if pool is not None:
            await env.afinish()
            pool.close()


class Echo:
    async def echo(self, value: str) -> str:
        return value


async def bare_actor_latencies() -> list[float]:
    """A no-op call of an async Ray actor: the floor any remote step pays on this machine."""
    import ray

    actor = ray.remote(Echo).options(num_cpus=0).remote()

    def call() -> asyncio.Future[str]:
        return asyncio.wrap_future(actor.echo.remote("go").future())

    await timed(20, call)
    try:
        return await timed(OVERHEAD_STEPS, call)
    finally:
        ray.kill(actor)


def main() -> None:
    import ray

    get_plugin_manager().register_plugin(BenchPlugin(), Provider("bench", "0"))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tokenizer = make_tokenizer("chatml")
    console = Console()
    console.print(f"latency-bound env: {TURNS} steps of {STEP_MS:g} ms each, {ENVS_PER_WORKER} envs per worker, "
                  f"{ROUNDS} episodes per env slot; every row plays the same episodes at its concurrency")
    table = Table(title="episodes/s against env workers (generator.env_placement=ray) and local placement")
    for column in ("workers", "concurrency", "local ep/s", "ray ep/s", "ray / local", "scaling efficiency"):
        table.add_column(column, justify="right")
    one_worker = None
    for workers in WORKERS:
        concurrency = workers * ENVS_PER_WORKER
        local = episodes_per_second(tokenizer, "local", concurrency, workers)
        remote = episodes_per_second(tokenizer, "ray", concurrency, workers)
        one_worker = one_worker or remote
        table.add_row(str(workers), str(concurrency), f"{local:.1f}", f"{remote:.1f}", f"{remote / local:.2f}",
                      f"{remote / (workers * one_worker):.2f}")
    console.print(table)
    local_steps = asyncio.run(step_latencies(remote=False))
    remote_steps = asyncio.run(step_latencies(remote=True))
    bare_calls = asyncio.run(bare_actor_latencies())
    steps = Table(title=f"one step at a time, zero-latency env ({OVERHEAD_STEPS} steps)")
    for column in ("placement", "p50 ms", "p90 ms", "p99 ms"):
        steps.add_column(column, justify="right")
    for name, samples in (("local", local_steps), ("ray", remote_steps), ("no-op Ray actor call", bare_calls)):
        steps.add_row(name, *(f"{percentile(samples, q) * 1000:.3f}" for q in (50, 90, 99)))
    console.print(steps)
    overhead = (percentile(remote_steps, 50) - percentile(local_steps, 50)) * 1000
    console.print(f"Ray overhead per step (p50, ray - local): {overhead:.2f} ms (target <= 2 ms); of which a no-op "
                  f"Ray actor call is {percentile(bare_calls, 50) * 1000:.2f} ms")
    ray.shutdown()


if __name__ == "__main__":
    main()
