"""Per-root-rollout budgets: sub-call count, generated tokens and concurrent children per depth.

One :class:`RolloutBudget` is shared by a root episode and all its descendants. Concurrency is
limited per depth level: a child holds a slot of its own level while it waits for slots of the
next one, so waits always point down the tree and can never form a cycle (no deadlock).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from skyrl_core.generator import EpisodeStop

from skyrl_rlm_repl.config import SubcallLimits


class TokenBudgetExhausted(EpisodeStop):
    """The rollout tree has generated ``max_total_tokens`` tokens; its episodes stop (trainably)."""

    def __init__(self, message: str) -> None:
        super().__init__("token_budget", message)


class RolloutBudget:
    """Counters and limits of one rollout tree (used from a single event loop)."""

    def __init__(self, limits: SubcallLimits) -> None:
        self.limits = limits
        self.sub_calls = 0
        self.tokens = 0
        self.refusals = 0
        self._slots: dict[int, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(limits.max_concurrent_children))

    @property
    def tokens_left(self) -> int:
        return max(0, self.limits.max_total_tokens - self.tokens)

    def refusal(self, method: str, depth: int) -> str | None:
        """Why one more ``method`` call from a REPL at ``depth`` is refused, or ``None`` to allow it."""
        limits = self.limits
        if method.startswith("rlm_") and depth + 1 > limits.max_depth:
            reason = (f"max_depth={limits.max_depth} reached: this REPL is at depth {depth}, so it cannot start "
                      "child REPLs; use llm_query or solve it here")
        elif self.sub_calls >= limits.max_sub_calls:
            reason = f"max_sub_calls={limits.max_sub_calls} sub-calls per rollout are used up"
        elif self.tokens_left <= 0:
            reason = f"max_total_tokens={limits.max_total_tokens} tokens per rollout are used up"
        else:
            self.sub_calls += 1
            return None
        self.refusals += 1
        return f"Error: {method} refused: {reason}."

    def child_slot(self, depth: int) -> asyncio.Semaphore:
        """The semaphore a child episode at ``depth`` holds while it runs."""
        return self._slots[depth]

    def charge(self, tokens: int) -> None:
        self.tokens += tokens

    def cap(self, max_tokens: int) -> int:
        """``max_tokens`` lowered to what is left; raises :class:`TokenBudgetExhausted` at zero."""
        if self.tokens_left <= 0:
            raise TokenBudgetExhausted(f"the rollout tree used its max_total_tokens={self.limits.max_total_tokens}")
        return min(max_tokens, self.tokens_left)
