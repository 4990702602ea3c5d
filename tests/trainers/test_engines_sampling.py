"""Per-row sampling and logprobs of the hf engine, against hand-computed distributions."""

from __future__ import annotations

import math

import pytest
import torch
from skyrl_trainers.engines.sampling import RowParams, processed_logprobs, sample_next

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0]])


def row(temperature=1.0, top_k=-1, top_p=1.0, seed=0):
    return RowParams(temperature, top_k, top_p, torch.Generator().manual_seed(seed))


def log_normalised(values):
    total = sum(math.exp(v) for v in values)
    return [v - math.log(total) for v in values]


def test_top_k_renormalises_over_the_kept_tokens():
    # top-2 of [2, 1, 0, -1] at temperature 1: log(e^2 / (e^2 + e^1)), log(e^1 / (e^2 + e^1)), -inf, -inf
    out = processed_logprobs(LOGITS, [row(top_k=2)])[0]
    assert out[:2].tolist() == pytest.approx(log_normalised([2.0, 1.0]))
    assert out[2:].tolist() == [-math.inf, -math.inf]


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities ~ [0.644, 0.237, 0.087, 0.032]: p=0.7 keeps the first two, p=0.5 only the first
    assert torch.isfinite(processed_logprobs(LOGITS, [row(top_p=0.7)])[0]).tolist() == [True, True, False, False]
    assert processed_logprobs(LOGITS, [row(top_p=0.5)])[0].tolist() == [0.0] + [-math.inf] * 3


@pytest.mark.parametrize("top_p", [0.0, 1e-46, 1e-30])
def test_a_top_p_that_rounds_to_zero_still_keeps_the_likeliest_token(top_p):
    """1e-46 is 0 as a float32; a top-p set must never be empty (it sampled the vocabulary's last id)."""
    assert processed_logprobs(LOGITS, [row(top_p=top_p)])[0].tolist() == [0.0] + [-math.inf] * 3
    tokens, logprobs = sample_next(LOGITS.repeat(8, 1), [row(top_p=top_p, seed=s) for s in range(8)])
    assert tokens.tolist() == [0] * 8 and logprobs.tolist() == [0.0] * 8


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-8])
def test_a_tiny_temperature_samples_the_likeliest_token_not_the_last(temperature):
    """Logits divided by 1e-40 overflow float32: the NaN that followed picked the last id every time."""
    logits = torch.tensor([[30.0, 29.9, 0.0, -1.0]])
    out = processed_logprobs(logits, [row(temperature=temperature)])[0]
    assert torch.isfinite(out[0]) and out[0].item() == pytest.approx(0.0)
    tokens, _ = sample_next(logits.repeat(8, 1), [row(temperature=temperature, seed=s) for s in range(8)])
    assert tokens.tolist() == [0] * 8


def test_temperature_scales_before_normalising():
    out = processed_logprobs(LOGITS, [row(temperature=0.5)])[0]
    assert out.tolist() == pytest.approx(log_normalised([4.0, 2.0, 0.0, -2.0]))


def test_rows_keep_their_own_settings_and_modes():
    logits = LOGITS.repeat(3, 1)
    rows = [row(temperature=0), row(top_k=1), row(temperature=0.5, seed=3)]
    tokens, processed = sample_next(logits, rows, "processed")
    raw_tokens, raw = sample_next(logits, [row(temperature=0), row(top_k=1), row(temperature=0.5, seed=3)], "raw")
    assert tokens.tolist()[:2] == [0, 0] and tokens.tolist() == raw_tokens.tolist()
    raw_expected = log_normalised([2.0, 1.0, 0.0, -1.0])
    assert processed[0].item() == pytest.approx(raw_expected[0])  # greedy reports the model's own logprob
    assert processed[1].item() == pytest.approx(0.0)  # the only token left after top-1
    assert processed[2].item() == pytest.approx(log_normalised([4.0, 2.0, 0.0, -2.0])[tokens[2]])
    assert raw.tolist() == pytest.approx([raw_expected[t] for t in tokens.tolist()])


def test_sampling_frequencies_follow_the_processed_distribution():
    generator = torch.Generator().manual_seed(0)
    rows = [RowParams(1.0, 2, 1.0, generator)]
    counts = torch.zeros(4)
    for _ in range(2000):
        token, _ = sample_next(LOGITS, rows)
        counts[token] += 1
    expected = math.exp(log_normalised([2.0, 1.0])[0])
    assert counts[2:].sum() == 0 and counts[0] / 2000 == pytest.approx(expected, abs=0.04)


def test_sampling_over_a_large_vocabulary_follows_the_distribution_across_blocks():
    # 1000 tokens (blocks of 256, the last one partial): the mass sits on a few tokens in different
    # blocks, the rest is masked out by top-k; frequencies and logprobs match the processed distribution.
    logits = torch.full((1, 1000), -30.0)
    hot = [3, 255, 256, 700, 999]
    logits[0, hot] = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.5])
    generator = torch.Generator().manual_seed(1)
    rows = [RowParams(1.0, 5, 1.0, generator)] * 4  # four rows sharing one generator
    expected = processed_logprobs(logits, rows[:1])[0]
    counts = torch.zeros(1000)
    for _ in range(1000):
        tokens, logprobs = sample_next(logits.repeat(4, 1), rows)
        counts.index_add_(0, tokens, torch.ones(4))
        assert logprobs.tolist() == pytest.approx(expected[tokens].tolist(), abs=1e-5)
    assert set(counts.nonzero().squeeze(1).tolist()) == set(hot)
    assert (counts[hot] / 4000).tolist() == pytest.approx(expected[hot].exp().tolist(), abs=0.03)


def test_greedy_and_sampled_rows_mix_in_raw_mode():
    logits = torch.randn(3, 600, generator=torch.Generator().manual_seed(0))
    rows = [row(temperature=0), row(temperature=0.7, seed=1), row(temperature=0)]
    tokens, logprobs = sample_next(logits, rows, "raw")
    raw = torch.log_softmax(logits, -1)
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert logprobs.tolist() == pytest.approx(raw.gather(1, tokens[:, None]).squeeze(1).tolist(), abs=1e-5)
