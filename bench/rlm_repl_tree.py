"""Tree rollouts: episodes/s of rlm_tree (each root runs 2 child REPLs) vs roots alone, same run.

A zero-latency scripted policy isolates the cost of the machinery: sandbox start from the pool,
code execution, the sub-call round trip from the sandbox to the generator, child episodes and tree
bookkeeping. Baseline: the ``default`` generator on the same env, where each root runs one block
and answers (no sub-calls). Ratio = tree episodes/s over baseline episodes/s (1.0 = a child episode
costs as much as a root episode). Run: python bench/rlm_repl_tree.py
"""

from __future__ import annotations

import asyncio
import time

from rich.console import Console
from rich.table import Table
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_rlm_repl.evidence.dataset import load_tasks
from skyrl_rlm_repl.tree import RLMTreeConfig, RLMTreeGenerator

ROOTS = (8, 32, 64)
SAMPLES = 8
CHILD = "```repl\nFINAL([h['text'] for h in search('the')][:1])\n```"
ROOT_TREE = ("```repl\nids = list(context)\nout = rlm_query_batched(['CHILD ' + i for i in ids[:2]], "
             "context_list=[context[i] for i in ids[:2]])\nFINAL([s for a in out for s in a])\n```")
ROOT_ALONE = "```repl\nFINAL([h['text'] for h in search('the')][:1])\n```"
OPTIONS = {"max_tokens_per_turn": 200, "max_context_length": 6000, "max_total_tokens": 2000}


def policy(tokenizer, root_reply: str) -> ScriptedEngine:
    def reply(ids: list[int]) -> str:
        first_user = tokenizer.decode(ids).split("<|im_start|>user\n")[1]
        return CHILD if first_user.startswith("CHILD") else root_reply

    return ScriptedEngine(tokenizer, default=reply)


async def run(generator: MultiTurnGenerator, roots: int) -> tuple[int, float]:
    tasks = load_tasks(split="train")[: roots // SAMPLES]
    started = time.perf_counter()
    batch = await generator.generate(tasks, n_samples=SAMPLES)
    seconds = time.perf_counter() - started
    assert all(t.error is None for t in batch), [t.error for t in batch if t.error]
    return len(batch), seconds


async def main() -> None:
    tokenizer = make_tokenizer("chatml")
    env = {"max_turns": 2}
    baseline = MultiTurnGenerator(GeneratorConfig(**OPTIONS), engine=policy(tokenizer, ROOT_ALONE),
                                  tokenizer=tokenizer, env_id="rlm_repl", env_config=env)
    tree = RLMTreeGenerator(RLMTreeConfig(**OPTIONS), engine=policy(tokenizer, ROOT_TREE), tokenizer=tokenizer,
                            env_id="rlm_repl", env_config=env)
    await run(baseline, SAMPLES)  # warm the sandbox pool and imports
    table = Table(title="rlm_tree vs roots alone (scripted policy, zero latency)")
    for column in ("roots", "baseline episodes", "baseline s", "baseline ep/s", "tree episodes", "tree s",
                   "tree ep/s", "ratio"):
        table.add_column(column, justify="right")
    for roots in ROOTS:
        base_n, base_s = await run(baseline, roots)
        tree_n, tree_s = await run(tree, roots)
        base_rate, tree_rate = base_n / base_s, tree_n / tree_s
        table.add_row(str(roots), str(base_n), f"{base_s:.2f}", f"{base_rate:.1f}", str(tree_n), f"{tree_s:.2f}",
                      f"{tree_rate:.1f}", f"{tree_rate / base_rate:.2f}")
    Console().print(table)


if __name__ == "__main__":
    asyncio.run(main())
