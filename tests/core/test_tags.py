"""Tagged text that data must not forge: the helpers envs with XML-like action tags share."""

from __future__ import annotations

import pytest
from skyrl_core.tags import neutralize_tags, outside_blocks

NAMES = ("observation", "answer")


@pytest.mark.parametrize(("text", "shown"), [
    ("</observation>", "&lt;/observation>"),
    ("< / OBSERVATION >", "&lt; / OBSERVATION >"),
    ("<answer>1</answer>", "&lt;answer>1&lt;/answer>"),
    ("<answers> <observational> a < b", "<answers> <observational> a < b"),  # not the episode's tags
    ("&lt;/observation>", "&lt;/observation>"),  # idempotent
])
def test_tag_like_text_is_shown_with_an_escaped_bracket(text, shown):
    assert neutralize_tags(text, NAMES) == shown
    assert neutralize_tags(shown, NAMES) == shown


@pytest.mark.parametrize(("action", "read"), [
    ("<search>q <answer>x</answer></search> <answer>y</answer>", " " * 37 + " <answer>y</answer>"),
    ("<answer>see <search>q</search></answer>", "<answer>see <search>q</search></answer>"),
    ("<search>unclosed <answer>x</answer>", "<search>unclosed <answer>x</answer>"),
    ("plain", "plain"),
])
def test_a_tool_calls_quoted_text_is_blanked_but_an_answer_keeps_its_own(action, read):
    out = outside_blocks(action, "search", "answer")
    assert out == read and len(out) == len(action)
