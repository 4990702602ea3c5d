"""Generator overhead: episodes/s through the default generator vs a bare loop of the same env steps.

A zero-latency scripted engine and a trivial 3-turn env isolate the generator's own cost (chat
templating, token bookkeeping, asyncio scheduling, the env's worker-thread hop). The bare loop
calls reset/step directly with the same actions. Run: python bench/core_generator.py
"""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.table import Table
from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.plugins import get_plugin_manager
from skyrl_core.registry import Provider
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer

TURNS = 3
EPISODES = 256
ACTIONS = ["step one", "step two", "done"]


class TrivialEnv(TextEnv):
    def take_action(self, action: str) -> StepResult:
        done = action == "done"
        return StepResult([] if done else [{"role": "user", "content": "ok"}], float(done), done, False, {})


class BenchPlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="bench_trivial", entry_point=f"{__name__}:TrivialEnv"))


def bare_loop(n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        env = TrivialEnv(task={"prompt": f"task {i}"}, config={"max_turns": TURNS})
        env.reset(seed=i)
        for action in ACTIONS:
            if env.step(action).terminated:
                break
        env.close()
    return n / (time.perf_counter() - started)


def through_generator(n: int, concurrency: int, tokenizer) -> float:
    replies = iter(ACTIONS * n)
    engine = ScriptedEngine(tokenizer, default=lambda ids: next(replies))
    gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_turns=TURNS, max_concurrency=concurrency),
                             engine=engine, tokenizer=tokenizer, env_id="bench_trivial")
    tasks = [{"prompt": f"task {i}"} for i in range(n)]
    started = time.perf_counter()
    batch = asyncio.run(gen.generate(tasks))
    elapsed = time.perf_counter() - started
    assert all(t.error is None for t in batch), "benchmark episodes must not fail"
    return n / elapsed


def main() -> None:
    __import__("sys").modules.setdefault(__name__, __import__("sys").modules[__name__])
    get_plugin_manager().register_plugin(BenchPlugin(), Provider("bench", "0"))
    tokenizer = make_tokenizer("chatml")
    bare_loop(32), through_generator(32, 16, tokenizer)  # warm-up
    baseline = bare_loop(EPISODES)
    table = Table(title=f"default generator overhead ({EPISODES} episodes x {TURNS} turns, zero-latency engine)")
    for column in ("mode", "concurrency", "episodes/s", "bare loop / mode"):
        table.add_column(column, justify="right")
    table.add_row("bare env loop (baseline)", "-", f"{baseline:,.0f}", "1.00")
    for concurrency in (1, 16, 256):
        rate = through_generator(EPISODES, concurrency, tokenizer)
        table.add_row("generator", str(concurrency), f"{rate:,.0f}", f"{baseline / rate:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
