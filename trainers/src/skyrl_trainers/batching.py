"""Training samples from trajectories, and their split into mini-batches, ranks and micro-batches.

A step's samples are cut into ``mini_batches`` contiguous mini-batches (one optimizer step each).
Within a mini-batch, samples go to the rank with the fewest tokens so far (longest first), and each
rank packs its samples into micro-batches whose padded size (rows x longest row) stays within the
token budget. Ranks get the same number of micro-batches (empty ones are padded in) because every
forward/backward of a sharded model is a collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from skyrl_core.factory import ConfigError
from skyrl_core.trajectory import Trajectory


class UntrainableTrajectoryError(ConfigError):  # a ConfigError: `skyrl run` reports it in one line
    """A batch holds trajectories that are marked not trainable (``Trajectory.trainable`` is false)."""


@dataclass
class TrainSample:
    """``input_ids = prompt + response``; masks and logprobs cover the response part only."""

    input_ids: list[int]
    response_start: int
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float

    @property
    def num_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class MiniBatchPlan:
    """One optimizer step: this rank's micro-batches and the normalisers of the whole mini-batch."""

    micro_batches: list[list[TrainSample]]
    batch_tokens: int
    batch_sequences: int


def training_samples(trajectories: Sequence[Trajectory], advantages: Sequence[float | None]) -> list[TrainSample]:
    """Samples for the trajectories that are trained on (advantage not ``None``, at least one masked token).

    Raises :class:`UntrainableTrajectoryError` for trajectories whose ids are not model tokens (the
    ``openai`` engine's chat mode, which is for evaluation).
    """
    untrainable = [t for t in trajectories if not t.trainable]
    if untrainable:
        raise UntrainableTrajectoryError(
            f"{len(untrainable)} of {len(trajectories)} trajectories (e.g. {untrainable[0].id}) hold chat text, not "
            f"model token ids (token_source {untrainable[0].token_source!r}, from the openai engine's chat mode), "
            "so they cannot be trained on; train with the hf or vllm engine, and use engine.mode=chat for "
            "evaluation only")
    out = []
    for t, advantage in zip(trajectories, advantages, strict=True):
        if advantage is None or not any(t.loss_mask):
            continue
        out.append(TrainSample(list(t.prompt_ids) + list(t.response_ids), len(t.prompt_ids), list(t.loss_mask),
                               list(t.logprobs), float(advantage)))
    return out


def plan_step(samples: Sequence[TrainSample], *, world_size: int, mini_batches: int,
              micro_batch_tokens: int) -> list[list[MiniBatchPlan]]:
    """``plan[rank][k]``: what ``rank`` runs for optimizer step ``k`` of this training step."""
    plans: list[list[MiniBatchPlan]] = [[] for _ in range(world_size)]
    for chunk in _chunks(list(samples), mini_batches):
        tokens = sum(s.num_tokens for s in chunk)
        per_rank = [_micro_batches(rank_samples, micro_batch_tokens) for rank_samples in _balance(chunk, world_size)]
        depth = max(len(m) for m in per_rank)
        for rank, micro in enumerate(per_rank):
            micro += [[] for _ in range(depth - len(micro))]
            plans[rank].append(MiniBatchPlan(micro, tokens, len(chunk)))
    return plans


def _chunks(items: list[TrainSample], n: int) -> list[list[TrainSample]]:
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


def _balance(samples: list[TrainSample], world_size: int) -> list[list[TrainSample]]:
    ranks: list[list[TrainSample]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for sample in sorted(samples, key=lambda s: -len(s.input_ids)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        ranks[rank].append(sample)
        load[rank] += len(sample.input_ids)
    return ranks


def _micro_batches(samples: list[TrainSample], budget: int) -> list[list[TrainSample]]:
    out: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    longest = 0
    for sample in sorted(samples, key=lambda s: -len(s.input_ids)):
        length = max(longest, len(sample.input_ids))
        if current and length * (len(current) + 1) > budget:
            out.append(current)
            current, length = [], len(sample.input_ids)
        current.append(sample)
        longest = length
    if current:
        out.append(current)
    return out
