"""The block-running rule and text FINAL detection, and that the system prompt states the same rule."""

from __future__ import annotations

from skyrl_rlm_repl.parser import parse_response
from skyrl_rlm_repl.prompts import system_prompt


def test_every_repl_block_runs_in_order_and_other_fences_are_reported():
    parsed = parse_response("plan\n```repl\nx = 1\n```\ntext\n```python\nignored()\n```\n```repl\nprint(x)\n```\n")
    assert parsed.blocks == ("x = 1", "print(x)")
    assert parsed.problems == ("A ```python block was not run: only ```repl blocks run.",)
    assert parsed.final is None and parsed.final_var is None


def test_indented_block_is_dedented():
    assert parse_response("  ```repl\n  if True:\n      print(1)\n  ```").blocks == ("if True:\n    print(1)",)


def test_unclosed_empty_and_same_line_blocks_do_not_run_and_are_explained():
    assert parse_response("```repl\nprint('x')").problems[0].startswith("A ```repl block was opened but never closed")
    assert parse_response("```repl\n\n```").problems == ("An empty ```repl block was skipped.",)
    same_line = parse_response("```repl x = 1\n```")
    assert same_line.blocks == () and "fence line" in same_line.problems[0]


def test_text_final_without_a_block_is_an_answer_and_quotes_are_stripped():
    assert parse_response("The answer:\nFINAL(Paris)").final == "Paris"
    assert parse_response("FINAL('Paris')").final == "Paris"
    assert parse_response('FINAL(["a", "b"])').final == '["a", "b"]'


def test_text_final_takes_balanced_parentheses_and_not_later_lines():
    parsed = parse_response("FINAL(the answer (b) wins)\nprint(3)")
    assert parsed.final == "the answer (b) wins"


def test_final_must_start_a_line_and_last_one_wins():
    assert parse_response("I will call FINAL(x) later").final is None
    assert parse_response("FINAL(first)\nFINAL(second)").final == "second"


def test_final_inside_code_blocks_is_left_to_the_code():
    parsed = parse_response("```repl\nFINAL('from code')\n```")
    assert parsed.final is None and parsed.blocks == ("FINAL('from code')",)
    assert parse_response("```python\nFINAL(no)\n```").final is None


def test_final_var_in_text_names_a_variable():
    assert parse_response("```repl\nans = [1]\n```\nFINAL_VAR(ans)").final_var == "ans"
    assert parse_response("FINAL_VAR('ans')").final_var == "ans"
    assert parse_response("FINAL_VAR(not a name)").final_var is None


def test_unclosed_final_is_not_an_answer():
    assert parse_response("FINAL(never closed").final is None


def test_system_prompt_states_the_rule_the_parser_applies():
    prompt = system_prompt(max_turns=7, context={"a": {}}, depth=0, max_depth=1, max_sub_calls=4,
                           evidence_tools=True)
    assert "Every ```repl block in your response runs, top to bottom" in prompt
    assert "You have 7 responses" in prompt and "rlm_query(" in prompt and "search(" in prompt


def test_prompt_at_max_depth_offers_no_child_repls_and_no_subcalls_when_disabled():
    at_max = system_prompt(max_turns=3, context="x", depth=1, max_depth=1, max_sub_calls=4, evidence_tools=False)
    assert "llm_query(" in at_max and "rlm_query(" not in at_max and "search(" not in at_max
    assert "llm_query" not in system_prompt(max_turns=3, context="x", depth=0, max_depth=1, max_sub_calls=0,
                                            evidence_tools=False)


def test_hostile_response_with_thousands_of_unclosed_finals_parses_in_one_pass():
    hostile = "FINAL(\n" * 7000 + "FINAL(done)\n" + "((((" * 2000
    assert parse_response(hostile).final == "done"


def test_prompt_describes_the_context_without_including_it():
    papers = {"p1": {"Title": "A", "Intro": "x" * 1000}, "p2": {"Intro": "y" * 500}}
    prompt = system_prompt(max_turns=3, context=papers, depth=0, max_depth=1, max_sub_calls=4, evidence_tools=True)
    assert "a dict with 2 keys: 'p1', 'p2'; 1,501 characters of text in all" in prompt
    assert "x" * 100 not in prompt
