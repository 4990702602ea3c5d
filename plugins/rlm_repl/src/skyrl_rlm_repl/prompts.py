"""System prompts. The block-running rule stated here is the one :mod:`skyrl_rlm_repl.parser` applies.

Two styles: ``full`` documents every tool and rule (about 350 tokens); ``short`` is three sentences
for the starter tasks, where a small model does better with less to read (measured with
SmolLM2-135M: 37 of 48 sampled answers held a ```repl block with the short prompt and the worked
example, 23 of 48 with the full prompt and the example, none with the example written into the system prompt).
The worked example is one exchange placed before the task as real chat turns, which small models
copy far more readily than an example described inside the system prompt.
"""

from __future__ import annotations

from typing import Any

RULES = """\
You answer the user's request by writing Python code that runs in a persistent REPL. Variables you \
create stay available in later turns. Ordinary Python works: import re, json, math, collections, etc. \
The REPL has no network and cannot see files outside its own temporary folder.

How your response is read:
- Put code in blocks that start with a line holding exactly ```repl and end with a line holding exactly ```.
- Every ```repl block in your response runs, top to bottom. Other fences (```python) do not run.
- You see the printed output (print(...)) of your blocks in the next message. Long output is cut.
- You have {max_turns} responses in total. Answer before they run out.

Already defined in the REPL:
- context: the material for this task ({context_summary}). Inspect it with code; do not guess.
- FINAL(answer): ends the task with answer (a string, or a list for evidence tasks).
- FINAL_VAR("name"): ends the task with the value of the variable name.
- SHOW_VARS(): lists the variables you have created.
{subcall_tools}{task_tools}
You may also end by writing a line FINAL(your answer) outside any code block."""

SUBCALL_TOOLS = """\
- llm_query(prompt) -> str: ask a language model one question (it does not see context unless you put \
it in the prompt). llm_query_batched(prompts) -> list[str] asks several at once.
"""
RECURSIVE_TOOLS = """\
- rlm_query(prompt, context=None) -> answer: a helper with its own REPL solves prompt over context \
(default: your context) and returns its FINAL answer (a list if it answered with a list, a string starting with "Error:" if it gave none). rlm_query_batched(prompts, context_list=None) \
runs several helpers at once and returns their answers in order.
"""
LIMITS = """\
Sub-calls are limited to {max_sub_calls} per task; a call over a limit returns a string starting with \
"Error:".
"""

EVIDENCE_TOOLS = """\
- list_papers() -> list[str]: prints and returns the paper ids with their titles and section names.
- search(query, paper=None, max_hits=10) -> list[dict]: case-insensitive search over all sections \
(or one paper); each hit has paper, section and the matching sentence, which is a verbatim quote.
- read_section(paper, section) -> str: the full text of one section.
Answer with FINAL(list_of_snippets): each snippet must be copied verbatim from the papers (a sentence or \
a short passage), covering every piece of evidence for the question and nothing else.
"""

SHORT_RULES = """\
You answer by writing Python code in a ```repl block. It runs in a REPL where the variable context holds \
the data ({context_summary}). Call FINAL(answer) in your code to give the answer. You have {max_turns} \
responses."""

WORKED_EXAMPLE = (
    {"role": "user", "content": "What is the first word of context?"},
    {"role": "assistant", "content": "```repl\nFINAL(context.split()[0])\n```"},
)


def system_prompt(*, max_turns: int, context: Any, depth: int, max_depth: int, max_sub_calls: int,
                  evidence_tools: bool, style: str = "full") -> str:
    """The system message for an episode at ``depth`` of a rollout tree, in ``style`` full or short."""
    if style == "short":
        return SHORT_RULES.format(context_summary=describe_context(context), max_turns=max_turns)
    subcalls = ""
    if max_sub_calls > 0:
        subcalls = SUBCALL_TOOLS + (RECURSIVE_TOOLS if depth < max_depth else "")
        subcalls += LIMITS.format(max_sub_calls=max_sub_calls)
    return RULES.format(max_turns=max_turns, context_summary=describe_context(context), subcall_tools=subcalls,
                        task_tools=EVIDENCE_TOOLS if evidence_tools else "")


def describe_context(context: Any) -> str:
    """A one-line summary of the context's type and size (the context itself stays in the REPL)."""
    if isinstance(context, str):
        return f"a string of {len(context):,} characters"
    if isinstance(context, dict):
        keys = list(context)
        shown = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "")
        return f"a dict with {len(keys)} keys: {shown}; {_text_size(context):,} characters of text in all"
    if isinstance(context, (list, tuple)):
        return f"a list of {len(context)} items; {_text_size(context):,} characters of text in all"
    return f"a {type(context).__name__}"


def _text_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_text_size(v) for v in value)
    return 0
