"""Evidence reward: hand-computed precision/recall/F1, PDF-noise tolerance, hallucinated snippets."""

from __future__ import annotations

import pytest
from skyrl_rlm_repl.evidence.reward import SourceIndex, match_key, parse_snippets, score_evidence, similarity
from skyrl_rlm_repl.rewards import score_answer

PAPERS = {
    "p1": {"Abstract": "We train agents with group baselines. The baseline is the mean reward of eight samples.",
           "Results": "Training was 1.7 times faster. The eﬀective batch size was 64 episodes per step."},
    "p2": {"Method": "Each episode runs in a sandbox. Workers are pre-\nstarted in a pool so that start-up\n"
                     "takes 40 milliseconds."},
}
GOLD = ["The baseline is the mean reward of eight samples.", "Training was 1.7 times faster.",
        "Workers are pre-started in a pool so that start-up takes 40 milliseconds."]


def score(predicted, gold=GOLD, threshold=0.8):
    return score_evidence(predicted, gold, SourceIndex(PAPERS), threshold)


def test_hand_computed_precision_recall_f1():
    # 2 of 3 predictions are gold (P = 2/3), they cover 2 of 3 gold snippets (R = 2/3).
    result = score([GOLD[0], GOLD[1], "We train agents with group baselines."])
    assert result.precision == pytest.approx(2 / 3)
    assert result.recall == pytest.approx(2 / 3)
    assert result.f1 == pytest.approx(2 / 3)
    # 1 prediction, right: P = 1, R = 1/3, F1 = 2 * 1 * (1/3) / (4/3) = 0.5
    one = score([GOLD[1]])
    assert (one.precision, one.recall, one.f1) == (1.0, pytest.approx(1 / 3), pytest.approx(0.5))


def test_whitespace_hyphenation_ligatures_and_case_are_tolerated():
    noisy = ["Workers are pre-\nstarted in a pool so that start-up\ntakes 40 milliseconds.",
             "the BASELINE is the mean  reward of\neight samples",
             "The effective batch size was 64 episodes per step."]
    result = score(noisy, gold=[GOLD[2], GOLD[0], "The eﬀective batch size was 64 episodes per step."])
    assert result.f1 == 1.0 and result.grounded == 1.0


def test_hallucinated_or_paraphrased_snippets_score_zero_even_when_close_to_gold():
    result = score(["The baseline is the average reward of eight samples.", "Training was 2 times faster."])
    assert result.grounded == 0.0 and result.f1 == 0.0 and result.precision == 0.0


def test_returning_everything_is_punished_by_precision():
    everything = [s for sections in PAPERS.values() for text in sections.values() for s in text.split(". ")]
    result = score(everything)
    assert result.recall < 1.0 or result.precision < 0.6


def test_partial_span_counts_above_the_threshold_only():
    partial = "are pre-started in a pool so that start-up takes 40 milliseconds."  # 52 of 59 key characters
    assert similarity(partial, GOLD[2]) == pytest.approx(52 / 59) == len(match_key(partial)) / len(match_key(GOLD[2]))
    assert score([partial], threshold=0.8).recall == pytest.approx(1 / 3)
    assert score(["Workers are pre-started"], threshold=0.8).recall == 0.0


def test_duplicate_predictions_match_one_gold_snippet_once():
    result = score([GOLD[0], GOLD[0]])
    assert result.precision == 0.5 and result.recall == pytest.approx(1 / 3)


def test_parse_snippets_accepts_python_and_json_lists_strings_and_text():
    assert parse_snippets("['a', 'b']") == ["a", "b"]
    assert parse_snippets('["a", "b"]') == ["a", "b"]
    assert parse_snippets("'one'") == ["one"]
    assert parse_snippets("first passage\n\nsecond passage") == ["first passage", "second passage"]
    assert parse_snippets("") == [] and parse_snippets("[]") == []


def test_empty_answer_scores_zero():
    assert score([]).f1 == 0.0


def test_score_answer_uses_the_task_kind():
    reward, parts = score_answer({"evidence": GOLD}, PAPERS, repr(GOLD), 0.8)
    assert reward == 1.0 and parts["f1"] == 1.0
    assert score_answer({"answer": "Paris"}, "", " paris. ", 0.8)[0] == 1.0
    assert score_answer({"answer": "Paris"}, "", "Lyon", 0.8)[0] == 0.0
    # A child (no gold): the fraction of its snippets that occur in its context.
    reward, parts = score_answer({}, PAPERS, repr([GOLD[0], "made up"]), 0.8)
    assert reward == 0.5 and parts == {"grounded_fraction": 0.5}


def test_judge_reply_parsing_and_engine_requirement():
    from skyrl_rlm_repl.evidence.judge import EvidenceJudge, judge_prompt, parse_judge_score

    assert parse_judge_score("reasoning...\nSCORE: 7") == 0.7
    assert parse_judge_score("score: 10") == 1.0
    assert parse_judge_score("SCORE: 11") is None and parse_judge_score("eight") is None
    assert "[1] a\n[2] b" in judge_prompt("Q?", ["a", "b"], []) and "(none)" in judge_prompt("Q?", ["a"], [])
    with pytest.raises(TypeError, match="needs a chat\\(\\) method"):
        EvidenceJudge(object())


def test_many_long_grounded_snippets_are_scored_and_padding_costs_precision():
    sections = [text for paper in PAPERS.values() for text in paper.values()]
    result = score(sections * 50 + [GOLD[1]])
    assert result.recall == pytest.approx(1 / 3) and result.precision == pytest.approx(1 / 151)
