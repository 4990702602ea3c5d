"""The persistent namespace model code runs in: scaffold names, FINAL/FINAL_VAR, sub-call stubs."""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from .capture import CappedStream, OutputBudget
from .frozen import freeze

# Parameter names of the standard sub-call stubs: positional arguments are sent under these names.
RPC_PARAMETERS = {
    "llm_query": ("prompt", "model"),
    "llm_query_batched": ("prompts", "model"),
    "rlm_query": ("prompt", "context"),
    "rlm_query_batched": ("prompts", "context_list"),
}
MAX_ERROR_CHARS = 8_000
_WORKER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_BLOCK_PREFIX = "<repl-"  # a block's code runs under the file name <repl-N>


class Repl:
    """Executes code blocks in one namespace; the scaffold is rebuilt before every block.

    Everything in this process is reachable by model code, so nothing here is trusted: the parent
    decides the final answer from the ``FINAL`` request it receives. Rebuilding the scaffold from
    immutable sources (the compiled scaffold, the context text, a tuple snapshot of the builtins)
    keeps a block's in-place edits (patched code objects, a mutated ``context``, replaced builtins)
    from changing what later blocks are given.
    """

    def __init__(self, context_text: str | None, context_is_json: bool, rpc_methods: Iterable[str],
                 send_request: Callable[[str, dict], Any], max_output_chars: int, echo_last_expression: bool) -> None:
        self.max_output_chars = max_output_chars
        self.echo_last_expression = echo_last_expression
        self._count = 0
        self._context_text = context_text
        self._context_is_json = context_is_json
        self._rpc_methods = tuple(rpc_methods)
        self._send_request = send_request
        self._scaffold: Any = None  # the compiled scaffold (code objects are immutable)
        self._builtins = tuple(vars(builtins).items())
        self._scaffold_names: frozenset[str] = frozenset()
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self._install_scaffold()

    def run_scaffold(self, source: str) -> None:
        """Compile env-specific tool definitions; their top-level names become reserved too."""
        if source:
            self._scaffold = compile(source, "<scaffold>", "exec")
            before = set(self.namespace)
            self._install_scaffold()
            self._scaffold_names = frozenset(name for name in set(self.namespace) - before
                                             if not name.startswith("__"))

    def _restore_builtins(self) -> None:
        table = vars(builtins)
        table.clear()
        table.update(self._builtins)

    def _install_scaffold(self) -> None:
        self._restore_builtins()
        context: Any = self._context_text
        if context is not None and self._context_is_json:
            context = freeze(json.loads(context))
        final, final_var, show_vars = _make_answer_functions(self)  # fresh objects: nothing patched carries over
        self.namespace.update(__builtins__=builtins, FINAL=final, FINAL_VAR=final_var, SHOW_VARS=show_vars,
                              context=context)
        for method in self._rpc_methods:
            self.namespace[method] = _make_stub(method, self._send_request)
        if self._scaffold is not None:
            exec(self._scaffold, self.namespace)

    def _reserved(self) -> frozenset[str]:
        return frozenset({"FINAL", "FINAL_VAR", "SHOW_VARS", "context", *self._rpc_methods}) | self._scaffold_names

    def execute(self, code: str) -> dict:
        self._count += 1
        self._install_scaffold()
        budget = OutputBudget(self.max_output_chars)
        out, err = CappedStream(budget), CappedStream(budget)
        saved = sys.stdout, sys.stderr
        error = None
        sys.stdout, sys.stderr = out, err
        try:
            self._run(code, f"{_BLOCK_PREFIX}{self._count}>")
        except BaseException as exc:  # noqa: B036 - model code may raise anything, SystemExit included
            error = _format_exception(exc)
        finally:
            self._restore_builtins()  # the worker's own code runs next
            sys.stdout, sys.stderr = saved
        stdout = out.getvalue()
        if budget.cut:
            stdout += f"\n[... {budget.cut:,} more characters of output were cut (limit {self.max_output_chars:,})]"
        return {"stdout": stdout, "stderr": err.getvalue(), "error": error, "truncated_chars": budget.cut}

    def _run(self, code: str, filename: str) -> None:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename=filename)
        last = tree.body[-1] if self.echo_last_expression and tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            exec(compile(tree, filename, "exec"), self.namespace)
            value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
            if value is not None:
                print(repr(value))
        else:
            exec(compile(tree, filename, "exec"), self.namespace)

    def user_variables(self) -> dict[str, str]:
        reserved = self._reserved()
        return {name: type(value).__name__ for name, value in self.namespace.items()
                if not name.startswith("_") and name not in reserved}

    def submit(self, answer: Any) -> None:
        """Send ``answer`` (converted with str) to the parent, which records it as this block's final answer."""
        self._send_request("FINAL", {"answer": str(answer)})


def _make_answer_functions(repl: Repl) -> tuple[Callable[..., Any], ...]:
    def FINAL(answer: Any) -> None:  # noqa: N802 - the name model code calls
        """Submit ``answer`` (converted with str) as the final answer."""
        repl.submit(answer)

    def FINAL_VAR(name: Any) -> None:  # noqa: N802
        """Submit the value of the variable called ``name`` as the final answer."""
        if not isinstance(name, str):
            repl.submit(name)
        elif name.strip() in repl.namespace:
            repl.submit(repl.namespace[name.strip()])
        else:
            print(f"Error: variable {name!r} not found. Available variables: {sorted(repl.user_variables())}. "
                  "Assign the variable in a code block before calling FINAL_VAR on it.")

    def SHOW_VARS() -> str:  # noqa: N802
        """The variables created so far, with their types."""
        variables = repl.user_variables()
        return _Text(f"Available variables: {variables}" if variables else "No variables created yet.")

    return FINAL, FINAL_VAR, SHOW_VARS


class _Text(str):
    """A string that echoes without quotes, so a bare ``SHOW_VARS()`` reads like a message."""

    def __repr__(self) -> str:
        return str(self)


def _make_stub(method: str, send_request: Callable[[str, dict], Any]) -> Callable[..., Any]:
    names = RPC_PARAMETERS.get(method)

    def stub(*args: Any, **kwargs: Any) -> Any:
        if names is None:
            params = {"args": list(args), **kwargs}
        elif len(args) > len(names):
            raise TypeError(f"{method}() takes at most {len(names)} positional arguments ({', '.join(names)})")
        else:
            params = {**dict(zip(names, args, strict=False)), **kwargs}
        try:
            json.dumps(params)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{method}() arguments must be JSON data (str, int, float, bool, None, list, dict): "
                            f"{exc}") from None
        return send_request(method, params)

    stub.__name__ = stub.__qualname__ = method
    stub.__doc__ = f"Ask the host to run {method}; blocks until it answers."
    return stub


def _format_exception(exc: BaseException) -> str:
    """The exception as Python's own REPL shows it: without the harness's frames (they say nothing useful
    and show host paths), so a block that does not parse reads as its line, a caret and the message."""
    summary = traceback.TracebackException.from_exception(exc)
    _drop_harness_frames(summary, seen=set())
    text = "".join(summary.format())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n[... traceback shortened ...]\n" + text[-MAX_ERROR_CHARS // 2:]
    return text


def _drop_harness_frames(summary: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the frames before the block's first one (the worker running it, and the standard library's
    parser when the block does not parse) and the worker's frames anywhere (e.g. the stubs a block calls)."""
    if id(summary) in seen:
        return
    seen.add(id(summary))
    frames = list(summary.stack)
    first = next((i for i, frame in enumerate(frames) if frame.filename.startswith(_BLOCK_PREFIX)), len(frames))
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in frames[first:] if not frame.filename.startswith(_WORKER_DIR)])
    for linked in (summary.__cause__, summary.__context__):
        if linked is not None:
            _drop_harness_frames(linked, seen)
