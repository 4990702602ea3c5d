"""How often one harbor_terminal step crosses to the sandbox loop: once, the last step's tests included (a step used
to cross twice, the second trip only to check whether the tests were still owed; now only an episode that ends
owing them, after a refused reply at the turn limit, crosses again)."""

from __future__ import annotations

from harbor_helpers import bash, builtin_row
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_sandbox.testing import loop_hops, require_backend


def test_a_step_crosses_to_the_sandbox_loop_once() -> None:
    require_backend("bwrap")
    row = builtin_row("hello-world-file")
    env = HarborTerminalEnv(task=row, config={"backend": "bwrap", "max_turns": 3})
    try:
        env.reset(options={"task": row})
        with loop_hops() as hops:
            first = env.step(bash("echo one"))
            second = env.step(bash("echo two"))
        assert not (first.terminated or first.truncated or second.terminated or second.truncated)
        assert len(hops) == 2, hops
        with loop_hops() as hops:
            last = env.step(bash("echo three"))  # the turn limit: the episode ends and its tests run
        assert last.truncated and last.reward == 0.0, last  # its tests ran and found no /app/hello.txt
        assert len(hops) == 1, hops  # the tests ran within the step's own trip
    finally:
        env.close()
