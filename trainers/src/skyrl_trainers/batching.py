"""Training samples from trajectories, and their split into mini-batches, ranks and micro-batches.

A step's samples are cut into ``mini_batches`` contiguous mini-batches (one optimizer step each).
Within a mini-batch, samples that share a prompt (a GRPO group) form packs that run the prompt once
(see :mod:`skyrl_trainers.forward`), split where a pack would exceed the token budget. Packs go to the
rank with the fewest tokens so far (longest first), and each rank fills micro-batches whose padded
size (rows x longest packed row) stays within the budget. Where the ranks carry prompts outside the
rows (:mod:`skyrl_trainers.prompt_cache`) a row holds one prompt token, and the budget counts that.
With ``skip_zero_advantage`` (no KL or entropy term in the loss) samples whose advantage is 0, such as
every sample of a GRPO group whose rewards were all equal, run nowhere: their loss and gradient are
exactly zero, and the normalisers still count them, so the update is the one they would have joined.
A mini-batch with no other sample keeps them all (its optimizer step still moves the weights by the
optimizer's momentum and weight decay, exactly as with them).
Ranks get the same number of micro-batches (empty ones are padded in) because every forward/backward
of a sharded model is a collective.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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

    @property
    def samples(self) -> list[TrainSample]:
        return [s for micro in self.micro_batches for s in micro]


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


def plan_step(samples: Sequence[TrainSample], *, world_size: int, mini_batches: int, micro_batch_tokens: int,
              carried_prompts: bool = False, skip_zero_advantage: bool = False) -> list[list[MiniBatchPlan]]:
    """``plan[rank][k]``: what ``rank`` runs for optimizer step ``k`` of this training step."""
    plans: list[list[MiniBatchPlan]] = [[] for _ in range(world_size)]
    length_of = functools.partial(packed_length, carried=carried_prompts)
    for chunk in _chunks(list(samples), mini_batches):
        tokens = sum(s.num_tokens for s in chunk)
        signal = [s for s in chunk if s.advantage != 0.0] if skip_zero_advantage else chunk
        packs = _packs(signal or chunk, micro_batch_tokens, length_of)
        per_rank = [_micro_batches(rank_packs, micro_batch_tokens, length_of)
                    for rank_packs in _balance(packs, world_size, length_of)]
        depth = max(len(m) for m in per_rank)
        for rank, micro in enumerate(per_rank):
            micro += [[] for _ in range(depth - len(micro))]
            plans[rank].append(MiniBatchPlan(micro, tokens, len(chunk)))
    return plans


def prompt_of(sample: TrainSample) -> tuple[int, ...]:
    return tuple(sample.input_ids[:sample.response_start])


def shared_prompt_rows(samples: Sequence[TrainSample]) -> list[list[int]]:
    """Indices of ``samples`` grouped by identical prompt, in order of first appearance: one packed row each."""
    rows: dict[tuple[int, ...], list[int]] = {}
    for index, sample in enumerate(samples):
        rows.setdefault(prompt_of(sample), []).append(index)
    return list(rows.values())


def packed_length(pack: Sequence[TrainSample], carried: bool = False) -> int:
    """Positions of a row holding the shared prompt once (with ``carried``, its last token only) and
    every sample's response."""
    prompt = pack[0].response_start
    return (min(prompt, 1) if carried else prompt) + sum(len(s.input_ids) - prompt for s in pack)


def _chunks(items: list[TrainSample], n: int) -> list[list[TrainSample]]:
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(items[start:end])
        start = end
    return out


PackLength = Callable[[Sequence[TrainSample]], int]


def _packs(samples: list[TrainSample], budget: int, length_of: PackLength) -> list[list[TrainSample]]:
    """Samples with one prompt, in packs no longer than ``budget`` (a single sample may be longer)."""
    packs: list[list[TrainSample]] = []
    for row in shared_prompt_rows(samples):
        current: list[TrainSample] = []
        for sample in sorted((samples[i] for i in row), key=lambda s: -len(s.input_ids)):
            if current and length_of([*current, sample]) > budget:
                packs.append(current)
                current = []
            current.append(sample)
        packs.append(current)
    return packs


def _balance(packs: list[list[TrainSample]], world_size: int, length_of: PackLength) -> list[list[list[TrainSample]]]:
    ranks: list[list[list[TrainSample]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for pack in sorted(packs, key=lambda p: -length_of(p)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        ranks[rank].append(pack)
        load[rank] += length_of(pack)
    return ranks


def _micro_batches(packs: list[list[TrainSample]], budget: int, length_of: PackLength) -> list[list[TrainSample]]:
    """Packs into micro-batches of at most ``budget`` padded positions; two packs of one prompt never
    share a micro-batch (collate would merge them into one row longer than planned)."""
    out: list[list[TrainSample]] = []
    current: list[list[TrainSample]] = []
    longest = 0
    for pack in sorted(packs, key=lambda p: -length_of(p)):
        length = max(longest, length_of(pack))
        clash = any(prompt_of(other[0]) == prompt_of(pack[0]) for other in current)
        if current and (length * (len(current) + 1) > budget or clash):
            out.append([s for p in current for s in p])
            current, length = [], length_of(pack)
        current.append(pack)
        longest = length
    if current:
        out.append([s for p in current for s in p])
    return out
