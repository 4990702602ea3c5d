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

# Parameter names of the standard sub-call stubs: positional arguments are sent under these names.
RPC_PARAMETERS = {
    "llm_query": ("prompt", "model"),
    "llm_query_batched": ("prompts", "model"),
    "rlm_query": ("prompt", "context"),
    "rlm_query_batched": ("prompts", "context_list"),
}
MAX_ERROR_CHARS = 8_000
_WORKER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class Repl:
    """Executes code blocks in one namespace and restores the reserved names after each block."""

    def __init__(self, context: Any, rpc_methods: Iterable[str], send_request: Callable[[str, dict], Any],
                 max_output_chars: int, max_answer_chars: int, echo_last_expression: bool) -> None:
        self.max_output_chars = max_output_chars
        self.max_answer_chars = max_answer_chars
        self.echo_last_expression = echo_last_expression
        self.final_answer: str | None = None
        self._count = 0
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.namespace.update(FINAL=self._final, FINAL_VAR=self._final_var, SHOW_VARS=self._show_vars,
                              context=context)
        for method in rpc_methods:
            self.namespace[method] = _make_stub(method, send_request)
        self._reserved: dict[str, Any] = {}
        self._snapshot_reserved()

    def run_scaffold(self, source: str) -> None:
        """Run env-specific tool definitions; their top-level names become reserved too."""
        if source:
            exec(compile(source, "<scaffold>", "exec"), self.namespace)
            self._snapshot_reserved()

    def _snapshot_reserved(self) -> None:
        self._reserved = {name: value for name, value in self.namespace.items() if not name.startswith("__")}

    def execute(self, code: str) -> dict:
        self._count += 1
        self.final_answer = None
        budget = OutputBudget(self.max_output_chars)
        out, err = CappedStream(budget), CappedStream(budget)
        saved = sys.stdout, sys.stderr
        error = None
        sys.stdout, sys.stderr = out, err
        try:
            self._run(code, f"<repl-{self._count}>")
        except BaseException as exc:  # noqa: B036 - model code may raise anything, SystemExit included
            error = _format_exception(exc)
        finally:
            sys.stdout, sys.stderr = saved
            self._restore_reserved()
        if self.final_answer is not None and len(self.final_answer) > self.max_answer_chars:
            error = (f"the final answer has {len(self.final_answer):,} characters, over the limit of "
                     f"{self.max_answer_chars:,}; it was not submitted")
            self.final_answer = None
        stdout = out.getvalue()
        if budget.cut:
            stdout += f"\n[... {budget.cut:,} more characters of output were cut (limit {self.max_output_chars:,})]"
        return {"stdout": stdout, "stderr": err.getvalue(), "error": error, "truncated_chars": budget.cut,
                "final_answer": self.final_answer}

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

    def _restore_reserved(self) -> None:
        self.namespace["__builtins__"] = builtins
        self.namespace.update(self._reserved)

    def user_variables(self) -> dict[str, str]:
        return {name: type(value).__name__ for name, value in self.namespace.items()
                if not name.startswith("_") and name not in self._reserved}

    # --- scaffold functions visible to model code -------------------------------------------------

    def _final(self, answer: Any) -> None:
        """Submit ``answer`` (converted with str) as the final answer."""
        self.final_answer = str(answer)

    def _final_var(self, name: Any) -> None:
        """Submit the value of the variable called ``name`` as the final answer."""
        if not isinstance(name, str):
            self.final_answer = str(name)
        elif name.strip() in self.namespace:
            self.final_answer = str(self.namespace[name.strip()])
        else:
            print(f"Error: variable {name!r} not found. Available variables: {sorted(self.user_variables())}. "
                  "Assign the variable in a code block before calling FINAL_VAR on it.")

    def _show_vars(self) -> str:
        """The variables created so far, with their types."""
        variables = self.user_variables()
        return _Text(f"Available variables: {variables}" if variables else "No variables created yet.")


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
    """The exception without the worker's own frames (they say nothing useful and show host paths)."""
    summary = traceback.TracebackException.from_exception(exc)
    _drop_worker_frames(summary, seen=set())
    text = "".join(summary.format())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n[... traceback shortened ...]\n" + text[-MAX_ERROR_CHARS // 2:]
    return text


def _drop_worker_frames(summary: traceback.TracebackException, seen: set[int]) -> None:
    if id(summary) in seen:
        return
    seen.add(id(summary))
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if not frame.filename.startswith(_WORKER_DIR)])
    for linked in (summary.__cause__, summary.__context__):
        if linked is not None:
            _drop_worker_frames(linked, seen)
