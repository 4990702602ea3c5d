"""Model text that never reaches a reasoning-gym scorer which would run it as Python.

reasoning-gym 0.1.25's ``score_answer`` calls ``eval(answer)`` on the model's answer in ``binary_matrix``,
``n_queens``, ``spiral_matrix`` and ``string_insertion``, and ``sympy.parse_expr(answer)`` (itself an ``eval``) in
``countdown``, ``puzzle24``, ``polynomial_multiplication``, ``simple_integration`` and
``intermediate_integration``: an answer such as ``__import__('os').system(...)`` would run in the training process,
and ``9**9**9**9`` would hold it for minutes. Before such a scorer sees an answer, this module checks it: for the
``eval`` datasets it must be a plain Python literal (``ast.literal_eval`` reads it, so ``eval`` gives the same value
and does nothing else) or text without calls, subscripts, attributes, strings, ``**`` and ``<<``; for the sympy
datasets it must be arithmetic over numbers, one-letter symbols and a few math functions, read as a Python
expression tree (``^`` counted as a power, as sympy's ``convert_xor`` would read it): no power of a power
(``(2**64)**64``, through any parentheses), numeric exponents of at most :data:`MAX_EXPONENT` in absolute value
however they are written (``2**(64*64*64)`` is refused), and no number bigger than :data:`MAX_BITS` bits on
the way. An answer that fails is scored as a missing answer. This is the cheap path, not the bound: an answer
that passes is still scored in a child process with memory, CPU and time limits
(:mod:`skyrl_bridge_reasoning_gym.sandbox`).
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction

EVAL_SCORERS = frozenset({"binary_matrix", "n_queens", "spiral_matrix", "string_insertion"})
SYMPY_SCORERS = frozenset({"countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
                           "intermediate_integration"})
EVALUATING = EVAL_SCORERS | SYMPY_SCORERS
"""The datasets whose scorer evaluates the model's answer as Python."""
MAX_CHARS = 20_000
MAX_EXPRESSION_CHARS = 2_000
MAX_EXPONENT = 64
MAX_BITS = 1 << 16
"""The largest number (in bits, an upper bound worked out from the tree) an admitted expression may make."""
_FUNCTIONS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                        "exp", "log", "ln", "sqrt", "pi", "E", "I", "oo"})
_INERT_BREAKERS = re.compile(r"[()\[\]{}.'\"`@:;\\]")
_EXPRESSION = re.compile(r"[0-9A-Za-z\s+\-*/^().,=]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def admissible(dataset: str, answer: str | None) -> bool:
    """May ``answer`` be passed to dataset ``dataset``'s scorer? (Always, for scorers that do not evaluate it.)"""
    if answer is None:
        return True
    if dataset in EVAL_SCORERS:
        return _literal(answer)
    if dataset in SYMPY_SCORERS:
        return _arithmetic(answer)
    return True


def _literal(answer: str) -> bool:
    """A Python literal, or text ``eval`` can only reject or compute cheaply (no calls, no subscripts or attributes,
    no strings, no ``**`` or ``<<``): e.g. the grid ``1 0\n0 1`` that the scorer compares before it evaluates."""
    if len(answer) > MAX_CHARS:
        return False
    if not _INERT_BREAKERS.search(answer) and "**" not in answer and "<<" not in answer:
        return True
    try:
        ast.literal_eval(answer)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _arithmetic(answer: str) -> bool:
    if len(answer) > MAX_EXPRESSION_CHARS or "__" in answer or not _EXPRESSION.fullmatch(answer):
        return False
    if any(len(name) > 1 and name not in _FUNCTIONS for name in _NAME.findall(answer)):
        return False
    # Both readings of ``^``: Python's (xor, low precedence; counted as a power too) and sympy's convert_xor one.
    return all(_small(text.strip()) for text in {answer, answer.replace("^", "**")})


class _Refused(Exception):
    pass


def _small(text: str) -> bool:
    """Does the expression ``text`` stay small: no power of a power, small numeric exponents, bounded numbers?"""
    if not text:
        return True  # the empty answer: every scorer reads it as nothing
    try:
        tree = ast.parse(text, mode="eval")
        _bits(tree.body)
    except (SyntaxError, ValueError, _Refused, RecursionError, MemoryError):
        return False
    return True


def _bits(node: ast.AST) -> int:
    """An upper bound on the size in bits of the value (a symbol counts as a small number); raises
    :class:`_Refused` where the expression is not small arithmetic."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex)) \
            and not isinstance(node.value, bool):
        value = abs(node.value)
        if isinstance(value, float) and not math.isfinite(value):
            return 2
        return max(int(value).bit_length(), 1) if value >= 1 else 1
    if isinstance(node, ast.Name):
        return 2
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        return _bits(node.operand)
    if isinstance(node, ast.Tuple):
        return max((_bits(item) for item in node.elts), default=1)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        return max((_bits(arg) for arg in node.args), default=1) + 1
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            return _power_bits(node.left, node.right)
        left, right = _bits(node.left), _bits(node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return _checked(max(left, right) + 1)
        if isinstance(node.op, (ast.Mult, ast.Div)):  # a quotient: numerator and denominator
            return _checked(left + right)
    raise _Refused


def _power_bits(base: ast.AST, exponent: ast.AST) -> int:
    if _is_power(_unwrapped(base)) or _has_power(exponent):
        raise _Refused  # a tower: a power of a power, or a power in the exponent
    base_bits = _bits(base)
    value = _numeric(exponent)
    if value is None:  # a symbolic exponent: counted as the largest one admitted
        _bits(exponent)
        return _checked(base_bits * MAX_EXPONENT)
    if abs(value) > MAX_EXPONENT:
        raise _Refused
    return _checked(base_bits * max(math.ceil(abs(value)), 1))


def _unwrapped(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.UnaryOp):
        node = node.operand
    return node


def _is_power(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.BitXor))


def _has_power(node: ast.AST) -> bool:
    return any(_is_power(sub) for sub in ast.walk(node))


def _numeric(node: ast.AST) -> Fraction | None:
    """The exact value of a power-free numeric expression (``None``: it has a symbol or a function)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise _Refused
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _numeric(node.operand)
        return None if value is None else (value if isinstance(node.op, ast.UAdd) else -value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _numeric(node.left), _numeric(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise _Refused
        return left / right
    return None


def _checked(bits: int) -> int:
    if bits > MAX_BITS:
        raise _Refused
    return bits
