"""How often one rlm_repl step crosses between loops: once to the sandbox loop, and once back to the caller's loop
per sub-call (the engine that answers it lives there)."""

from __future__ import annotations

import asyncio

from rlm_helpers import CONTEXT_TASK, repl
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_sandbox.testing import loop_hops, require_backend


def test_a_step_crosses_once_and_each_subcall_once_more() -> None:
    require_backend("bwrap")

    async def handler(method, params):  # noqa: ANN001, ANN202 - the sub-call handler's signature
        return f"answer to {params['prompt']}"

    async def play() -> tuple[list[str], list[str], str]:
        env = RLMReplEnv(task=CONTEXT_TASK, config={"sandbox": {"backend": "bwrap"}}, subcall_handler=handler)
        await asyncio.to_thread(env.reset, seed=0)
        try:
            with loop_hops() as plain:
                await env.astep(repl("x = 1", "print(x)"))
            with loop_hops() as with_calls:
                result = await env.astep(repl("print(llm_query('a'))", "print(llm_query('b'))"))
            return plain, with_calls, "\n".join(message["content"] for message in result.observation)
        finally:
            await asyncio.to_thread(env.close)

    plain, with_calls, text = asyncio.run(play())
    assert "answer to a" in text and "answer to b" in text
    assert len(plain) == 1, plain
    assert len(with_calls) == 3, with_calls  # the step, then one trip back per sub-call
