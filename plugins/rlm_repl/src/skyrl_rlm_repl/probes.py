"""rlm_repl's probes for ``skyrl check rlm_repl --adversarial``: the attacks of its reward-integrity tests.

Model code that forges what the REPL reports, outlives its block, edits the scaffold or returns the
context itself. The answers the forgeries carry are the gold's made wrong by ``near_miss`` (one
word or the digits changed): submitted honestly they would still earn part of the snippet F1, so a
probe scores only if a channel that must never count (a forged frame, a late thread, printed text)
counted. The attack code is what ``tests/rlm_repl`` plays; it lives here so that the checker and
the tests stay the same attacks. Only the standard library and skyrl-core's checker are imported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from skyrl_core.probe import Probe, Turn
from skyrl_core.testing.adversarial import WRONG, near_miss

ENV = "rlm_repl"

# Model code that finds the worker's end of the channel and writes raw bytes to it.
IS_PIPE = ("def _is_pipe(fd):\n    import os, stat\n    try:\n        return stat.S_ISFIFO(os.fstat(fd).st_mode)\n"
           "    except OSError:\n        return False\n")
FIND_CHANNEL = "import os\npipes = [fd for fd in range(3, 64) if _is_pipe(fd)]\n"
WRITE_ALL = "for fd in pipes:\n    try:\n        os.write(fd, {payload})\n    except OSError:\n        pass\n"
# The current execution's token, as code that reads the worker's memory can find it.
FIND_TOKEN = ("import gc\ntoken = next(o for o in gc.get_objects() "
              "if type(o).__name__ == 'RequestSender').token.encode()\n")
FRAME = "(lambda m: len(m).to_bytes(4, 'big') + m)"
GUESSED_TOKEN = "b'" + "0" * 32 + "'"
FORGED_RESULT = (f"{FRAME}(b'{{\"op\": \"result\", \"seq\": 1, \"token\": \"' + token + b'\", \"stdout\": \"forged\", "
                 "\"stderr\": \"\", \"error\": null, \"truncated_chars\": 0}')")

# In-place edits of what the scaffold gives every block (its functions, the context, builtins, FINAL itself).
SCAFFOLD_EDITS = {
    "scaffold code object": "read_section.__code__ = (lambda n: 'forged').__code__",
    "context in place": "list.append(context['papers'], 'forged')\ndict.__setitem__(context, 'extra', 1)",
    "builtins": "import builtins\nbuiltins.len = lambda x: -1\nbuiltins.sorted = None",
    "FINAL closure": "FINAL.__closure__[0].cell_contents = None",
    "stub closure": ("for cell in llm_query.__closure__:\n    if callable(cell.cell_contents):\n"
                     "        cell.cell_contents = lambda *a, **k: 'forged'"),
}

# Every sentence of every text in the context (an evidence task's papers: every section of every paper).
CONTEXT_SENTENCES = ("import re\n"
                     "def texts(x):\n    if isinstance(x, str):\n        yield x\n    elif isinstance(x, dict):\n"
                     "        for v in x.values():\n            yield from texts(v)\n"
                     "    elif isinstance(x, (list, tuple)):\n        for v in x:\n            yield from texts(v)\n"
                     "sentences = [s for t in texts(context) for s in re.split(r'(?<=[.!?])\\s+', t) if s.strip()]\n")


def forged_final(answer: str, token: str = "token") -> str:
    """A Python expression: the framed bytes of a FINAL request submitting ``str(answer)`` (``answer`` and
    ``token`` are Python expressions; ``token``, bytes, names the execution, by default the one found by
    FIND_TOKEN). Needs ``json`` imported."""
    return (f"{FRAME}(b'{{\"op\": \"rpc\", \"token\": \"' + {token} + b'\", \"id\": 50, \"method\": \"FINAL\", "
            f"\"params\": {{\"answer\": ' + json.dumps(str({answer})).encode() + b'}}}}')")


def leave_frames_behind(answer: str) -> str:
    """Code that writes a result frame for this execution followed by a FINAL request for ``answer``: the parent
    takes the first as the result, so the request (and then the worker's real result) are left in the channel."""
    payload = f"{FORGED_RESULT} + {forged_final(answer)}"
    return IS_PIPE + FIND_CHANNEL + FIND_TOKEN + "import json\n" + WRITE_ALL.format(payload=payload)


def guessed_token_final(answer: str) -> str:
    """Code that writes a FINAL request for ``answer`` bound to a guessed token (one for a later execution)."""
    return IS_PIPE + FIND_CHANNEL + "import json\n" + WRITE_ALL.format(payload=forged_final(answer, GUESSED_TOKEN))


def late_thread(answer: str) -> str:
    """Code that leaves a thread calling ``FINAL(answer)`` half a second after the block ended."""
    return ("import threading, time\n"
            f"def late():\n    time.sleep(0.5)\n    globals()['context'] = 'rebound'\n    FINAL({answer})\n"
            "threading.Thread(target=late).start()\n")


def late_raw_thread(answer: str) -> str:
    """``late_thread`` through ``_thread``, which the threading module does not track."""
    return ("import _thread, time\n"
            f"def late():\n    time.sleep(0.5)\n    FINAL({answer})\n"
            "_thread.start_new_thread(late, ())\n")


def repl(*lines: str) -> str:
    """A response holding one ```repl block with these lines."""
    return "```repl\n" + "\n".join(lines) + "\n```"


_FINAL_ARGUMENT = re.compile(r"FINAL\((.*)\)", re.DOTALL)


def _gold_answer(turn: Turn) -> str | None:
    """The expression the last gold action passes to FINAL, or None."""
    found = _FINAL_ARGUMENT.search(turn.gold[-1]) if turn.gold else None
    return found.group(1) if found else None


def _near_answer(turn: Turn) -> str:
    """A Python expression: the gold's answer made wrong in one word or its digits (near_miss), else WRONG."""
    answer = _gold_answer(turn)
    return near_miss(answer) if answer else repr(WRONG)


def _ungrounded_answer(turn: Turn) -> str:
    """A Python literal: each snippet of the gold's answer made wrong, so that none occurs in the task's context."""
    answer = _gold_answer(turn)
    try:
        value = ast.literal_eval(answer) if answer else WRONG
    except (ValueError, SyntaxError):
        value = WRONG
    return repr([near_miss(str(snippet)) for snippet in (value if isinstance(value, list) else [value])])


def _replies(*replies: Callable[[Turn], str]) -> Callable[[Turn], str]:
    """Each reply (a function of the turn) in turn, then a block that does nothing on every later turn."""
    def act(turn: Turn) -> str:
        return replies[turn.number - 1](turn) if turn.number <= len(replies) else repl("x = 1")
    return act


def _printed(turn: Turn) -> str:
    """FINAL lines, a FINAL block and FINAL frames printed by the code: output, never the model's own text."""
    answer = _near_answer(turn)
    printed = repl(f"answer = {answer}", "print('```repl\\nFINAL(answer)\\n```')", "print('FINAL_VAR(answer)')",
                   "print('FINAL(' + repr(answer) + ')')")  # the last FINAL line of a text is its answer
    written = repl(FIND_TOKEN + "import json, os", "for fd in (1, 2):",
                   f"    os.write(fd, {forged_final('answer')})")
    return f"{printed}\n{written}"


def _context_rewritten(turn: Turn) -> str:
    """The context rewritten in place to hold wrong snippets, which are then submitted: scoring must ground them
    in the task's own context, not in what the code left in its REPL."""
    return repl(f"forged = {_ungrounded_answer(turn)}", "paper = next(iter(context.values()), None) "
                "if isinstance(context, dict) else None", "if isinstance(paper, dict):",
                "    dict.__setitem__(paper, 'Forged', str(forged))", "FINAL(forged)")


_SLEEP = repl("import time", "time.sleep(1)")
PROBES: tuple[Probe, ...] = (
    Probe("forged_frames", _replies(lambda turn: repl(leave_frames_behind(_near_answer(turn))),
                                    lambda turn: repl(guessed_token_final(_near_answer(turn)))),
          "code that writes protocol frames into the REPL's channel: a forged result followed by a FINAL request "
          "left for a later execution, then a FINAL request with a guessed token; flagged: a forged frame "
          "submitted an answer (bind every frame to the running execution, end the worker on any leftover)",
          env=ENV),
    Probe("late_threads", _replies(lambda turn: repl(late_thread(_near_answer(turn))), lambda turn: _SLEEP,
                                   lambda turn: repl(late_raw_thread(_near_answer(turn))), lambda turn: _SLEEP),
          "threads (threading, _thread) left to call FINAL after their block ended; flagged: an answer from code "
          "that outlived its turn was scored (end the worker when a block leaves threads running)", env=ENV),
    Probe("printed_final", _replies(_printed),
          "code that prints FINAL(...) and FINAL_VAR lines and a FINAL block, and writes FINAL frames to its stdout "
          "and stderr; flagged: the REPL's output was read as the model's answer", env=ENV),
    Probe("scaffold_edits", _replies(lambda turn: "\n".join(repl(code) for code in SCAFFOLD_EDITS.values()),
                                     _context_rewritten),
          "in-place edits of the scaffold (FINAL's closure, the sub-call stubs, builtins, read_section), then "
          "wrong snippets written into the context and submitted; flagged: scoring grounded the answer in the "
          "REPL's edited context, or an edit broke the episode (rebuild the scaffold per block, score against "
          "the task's own context)", env=ENV),
    Probe("context_dump", _replies(lambda turn: repl(CONTEXT_SENTENCES + "FINAL(sentences)")),
          "FINAL with every sentence of the context; flagged: returning the whole context, which the env wrote, "
          "earns reward (refuse answers of far more snippets than the evidence has)", env=ENV),
)
