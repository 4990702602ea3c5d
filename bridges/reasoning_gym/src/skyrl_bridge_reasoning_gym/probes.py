"""reasoning_gym's probes for ``skyrl check reasoning_gym --adversarial``: hedging inside one answer block.

The env reads exactly one ``<answer>`` block, so several blocks answer nothing (the generic ``gold_hedged``
probe); what is left to a policy is to hedge inside the one block. ``hedged_in_block`` puts wrong answers around
the right one: a dataset whose ``score_answer`` searches the answer for the gold text (reasoning-gym's default
scorer gives ``len(gold) / len(answer)`` when the gold is a substring) pays for it. ``gold_then_wrong`` writes
the right answer then a wrong one: a scorer that reads only a prefix, the first item or the first match pays it
in full, so a policy learns to list its candidates. Only the standard library and skyrl-core's checker are
imported.
"""

from __future__ import annotations

from skyrl_core.probe import Probe, Turn
from skyrl_core.testing.adversarial import WRONG, near_miss

from skyrl_bridge_reasoning_gym.answer import answer_block, extract_answer

ENV = "reasoning_gym"


def _hedged_in_block(turn: Turn) -> str:
    if turn.number != 1:
        return WRONG
    gold = extract_answer(turn.gold[-1]) or ""
    wrong = near_miss(gold) if gold else "0"
    return answer_block(f"{wrong}\n{gold}\n{wrong}")


def _gold_then_wrong(turn: Turn) -> str:
    if turn.number != 1:
        return WRONG
    gold = extract_answer(turn.gold[-1]) or ""
    return answer_block(f"{gold}\n{near_miss(gold) if gold else '0'}")


PROBES: tuple[Probe, ...] = (
    Probe("hedged_in_block", _hedged_in_block,
          "the right answer between two wrong ones inside one <answer> block; flagged when it beats an honest wrong "
          "answer: the dataset's score_answer finds the gold text inside a longer answer (partial credit for a "
          "hedge)", needs_gold=True, bar="wrong", env=ENV),
    Probe("gold_then_wrong", _gold_then_wrong,
          "the right answer then a wrong one in one <answer> block; flagged when it earns the gold's full reward: the "
          "dataset's score_answer reads a prefix or the first match, so listing candidates costs nothing",
          needs_gold=True, bar="gold", env=ENV),
)
