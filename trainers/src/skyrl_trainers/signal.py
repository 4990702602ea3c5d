"""Steps with no learning signal: every sample of a group scored the same, so its advantages are 0.

GRPO and RLOO score each sample against the other samples of its task's group. A group whose samples
all got the same reward (all failed, all solved, or a reward that ignores the reply) has zero
variance and advantage 0 for every sample: it adds nothing to the loss or the gradient. A step where
(nearly) every group is like that trains nothing, and a run of such steps only burns compute, with a
loss and grad norm of 0 that look like convergence. :class:`NoSignalMonitor` counts those groups each
step (``train/zero_variance_groups``, a share), the current streak of no-signal steps
(``train/no_signal_steps``), and logs one warning per streak naming the cause and the usual fixes.
The first such step of a run also gets one line at once (:meth:`NoSignalMonitor.first_note`), so a
smoke run's ``loss 0 grad 0`` is explained at step 1 rather than after ``patience`` steps.
REINFORCE++ has no group baseline (it whitens over the batch), so for it the batch is the one group.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from skyrl_trainers.algorithms.advantages import FLAT_SPREAD

log = logging.getLogger(__name__)

GROUP_RELATIVE = ("grpo", "rloo")
"""Advantage estimators whose baseline is the sample's own group."""


def zero_variance_share(groups: Mapping[str, Sequence[float]], *, estimator: str = "grpo") -> tuple[float, int]:
    """(share of groups whose scores are all equal, number of groups) for a step's ``groups`` (see
    :func:`skyrl_trainers.credit.group_scores`). A group of one sample counts as zero variance (it has no
    other sample to be compared with); an estimator without group baselines makes the batch one group."""
    if estimator not in GROUP_RELATIVE:
        groups = {"batch": [score for scores in groups.values() for score in scores]} if groups else {}
    if not groups:
        return 0.0, 0
    flat = sum(1 for scores in groups.values() if max(scores) - min(scores) <= FLAT_SPREAD)
    return flat / len(groups), len(groups)


class NoSignalMonitor:
    """Per-step no-signal metrics and one warning per streak of ``patience`` steps at ``share`` or more.

    ``hints`` are the run's current settings shown in the warning (``n_samples_per_prompt``,
    ``temperature``, ``data_split``; ``model`` for :meth:`first_note`) and ``reward_range`` the env's, to
    say whether nothing or everything was solved.
    """

    def __init__(self, *, share: float = 0.9, patience: int = 3, reward_range: tuple[float, float] = (0.0, 1.0),
                 hints: Mapping[str, object] | None = None) -> None:
        self.share, self.patience = share, patience
        self.reward_range = reward_range
        self.hints = dict(hints or {})
        self.streak = 0
        self.first_step = 0
        self.rewards: list[float] = []
        self.noted = False  # the run's first no-signal step was explained (first_note)

    def update(self, step: int, share: float, groups: Mapping[str, Sequence[float]]) -> dict[str, float]:
        """Record ``step`` (its zero-variance ``share`` and its groups' scores); the metrics to log for it."""
        if groups and share >= self.share:
            if self.streak == 0:
                self.first_step, self.rewards = step, []
            self.streak += 1
            self.rewards.extend(score for scores in groups.values() for score in scores)
            if self.streak == self.patience:
                log.warning(self.message(step, share))
        else:
            self.streak = 0
        return {"train/zero_variance_groups": share, "train/no_signal_steps": float(self.streak)}

    def first_note(self, step: int) -> str | None:
        """One line explaining the run's first step without learning signal, at that step (``None`` for any
        other step, and where ``patience`` is 1: the full warning comes at once then)."""
        if self.noted or self.streak != 1 or self.first_step != step or self.patience <= 1:
            return None
        self.noted = True
        cause, _ = self._cause()
        model = self.hints.get("model")
        expected = ("expected with tiny-random, a random model that solves nothing" if model == "tiny-random"
                    else "common early on with a small model or hard tasks")
        return (f"step {step} had no learning signal: all samples of each task got the same reward; {cause}. So "
                f"every advantage is 0 and loss and grad norm are 0 (the weights do not change); {expected}. A "
                f"warning with fixes follows if this lasts {self.patience} steps in a row (trainer.no_signal_patience).")

    def _cause(self) -> tuple[str, str]:
        """(why the current streak's groups have zero variance, the data fix) from its rewards."""
        low, high = self.reward_range
        lowest, highest = min(self.rewards), max(self.rewards)
        if highest <= low + 1e-9:
            return (f"no sample solved its task (every reward was {low:g}, the bottom of the reward range)",
                    "an easier split or task file (trainer.data_split, trainer.train_files)")
        if lowest >= high - 1e-9:
            return (f"every sample solved its task (every reward was {high:g}, the top of the reward range)",
                    "a harder split or task file (trainer.data_split, trainer.train_files)")
        if highest - lowest <= 1e-9:
            return (f"every sample got the same reward, {lowest:g}: the reward does not depend on the reply",
                    "a reward that tells replies apart (check the env's reward)")
        return ("inside each such group every sample got the same reward, though the groups differ from each other",
                "an easier split for the groups that never succeed (trainer.data_split, trainer.train_files)")

    def message(self, step: int, share: float) -> str:
        """The warning for a streak that reached ``patience`` at ``step``: cause, evidence and fixes."""
        steps = f"step {step}" if step == self.first_step else f"steps {self.first_step}-{step}"
        cause, data = self._cause()
        samples = self.hints.get("n_samples_per_prompt")
        temperature = self.hints.get("temperature")
        fixes = [
            data,
            "more samples per task (generator.n_samples_per_prompt"
            + (f", now {samples}; try {2 * int(samples)}" if isinstance(samples, int) else "") + ")",
            "a higher sampling temperature (generator.temperature"
            + (f", now {temperature:g}" if isinstance(temperature, float | int) else "") + ")",
            "reward shaping: partial credit or a format reward, so near misses score above failures",
        ]
        return (f"no learning signal in {steps}: {share:.0%} of the task groups of the last step had zero reward "
                f"variance ({self.streak} step(s) in a row at {self.share:.0%} or more); {cause}. Group-relative "
                "advantages are then 0, so loss and grad norm are 0 and the policy does not change. Usual fixes: "
                + "; ".join(fixes) + ". (This warning comes once per streak: trainer.no_signal_share, "
                "trainer.no_signal_patience.)")
