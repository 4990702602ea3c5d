"""Search-R1's answer scoring: normalisation, EM, substring EM, token F1 and answer extraction."""

from __future__ import annotations

import pytest
from skyrl_search.reward import exact_match, extract_answer, normalize_answer, substring_match, token_f1


@pytest.mark.parametrize(("text", "normalised"), [
    ("The Eiffel Tower", "eiffel tower"),          # article and case
    ("an apple a day", "apple day"),                # every article
    ("Theodore Anand", "theodore anand"),           # articles only as whole words
    ("St. Louis, Missouri!", "st louis missouri"),  # punctuation
    ("  New \n\t York  ", "new york"),              # whitespace collapsed
    ("", ""),
])
def test_normalisation_follows_search_r1(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_is_after_normalisation_and_over_all_answers():
    assert exact_match("the  Velmora Guild.", ["Velmora Guild"]) == 1.0
    assert exact_match("Kelmar", ["Osk", "kelmar"]) == 1.0
    assert exact_match("Kelmar town", ["Kelmar"]) == 0.0
    assert exact_match("", ["Kelmar"]) == 0.0


def test_substring_match_finds_an_answer_inside_a_longer_prediction():
    assert substring_match("It was founded in Kelmar, I think", ["kelmar"]) == 1.0
    assert substring_match("Kel", ["Kelmar"]) == 0.0
    assert substring_match("anything", ["the"]) == 0.0  # an answer that normalises to nothing never matches


def test_token_f1_takes_the_best_answer():
    # prediction "orvan tessaly born" vs "orvan tessaly": precision 2/3, recall 1 -> F1 0.8
    assert token_f1("Orvan Tessaly born", ["Kelmar", "Orvan Tessaly"]) == pytest.approx(0.8)
    assert token_f1("Orvan Tessaly", ["orvan tessaly"]) == 1.0
    assert token_f1("Kelmar", ["Orvan Tessaly"]) == 0.0
    assert token_f1("", ["Orvan Tessaly"]) == 0.0


def test_the_last_complete_answer_wins():
    text = "<answer> Osk </answer> on second thought <answer>\nKelmar\n</answer> and <answer>Vorn"
    assert extract_answer(text) == "Kelmar"


@pytest.mark.parametrize("text", ["no tags at all", "<answer> never closed", "</answer> reversed <answer>"])
def test_no_complete_answer_gives_none(text):
    assert extract_answer(text) is None


def test_an_empty_answer_is_an_answer():
    assert extract_answer("<answer></answer>") == ""
