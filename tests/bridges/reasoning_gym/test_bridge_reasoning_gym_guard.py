"""The reasoning_gym bridge's guard (the cheap path) and its scorer child process (the bound)."""

from __future__ import annotations

import os
import random
import signal

import numpy as np
import pytest
from skyrl_bridge_reasoning_gym import sandbox
from skyrl_bridge_reasoning_gym.guard import admissible

pytestmark = pytest.mark.skipif(not sandbox.FORKS, reason="the scorer child needs os.fork")


@pytest.mark.parametrize("answer", [
    "(2^64)^64", "((2^64)^64)^64", "(((2**64)**64)**64)**64", "(-(2**64))**64", "((2**64))**(64)",
    "2^(64*64*64*64*64)", "2**(64*64*64*64*64)", "2**(2*2*2*2*2*2*2)", "2**(100-1)", "2**(64+1)", "2**-65",
    "2**(x**2)", "9**9**9**9", "2**64.5", "((2**64 + 1)**64 + 1)**64", "2**(1/0)",
    "__import__('os').system('true')", "exp(x).func", "x = 3", "1 +",
])
def test_towers_huge_exponents_and_code_are_refused_before_any_scorer(answer):
    assert not admissible("countdown", answer) and not admissible("simple_integration", answer)


@pytest.mark.parametrize("answer", [
    "6*(98 - 54) - 34 - 66", "(x**2 + 1)**3/6 + C", "3*x**4/4 - 2*x + C", "sin(x)**2", "2**-3", "2^10",
    "x**(1/2)", "-327405*y**6 + 934619*y**5 - 1", "2**64*2**64", "exp(2*x)/2 + C", "(2**64 + 1)**64", "x**y", "",
])
def test_small_arithmetic_is_admitted(answer):
    assert admissible("countdown", answer) and admissible("polynomial_multiplication", answer)


def test_the_eval_datasets_take_literals_and_inert_text_only():
    assert admissible("n_queens", "[['_', 'Q'], ['Q', '_']]") and admissible("binary_matrix", "0 1\n1 0")
    for answer in ("__import__('os').system('true')", "[1] * 10**10", "9**9**9**9", "1 << 10**9", "(lambda: 1)()"):
        assert not admissible("n_queens", answer) and not admissible("binary_matrix", answer)


def test_the_child_returns_the_value_and_what_the_call_raised():
    assert sandbox.call_in_child(lambda a, b: a / b, 1, 4, timeout_s=5) == 0.25
    with pytest.raises(sandbox.ChildRaised, match="ZeroDivisionError"):
        sandbox.call_in_child(lambda a, b: a / b, 1, 0, timeout_s=5)
    for reply in (b"cos\nsystem\n(S'true'\ntR.", b'["ok", "1"]', b'["raised", 3]', b"[]"):
        with pytest.raises(sandbox.ChildFailed, match="unreadable"):  # read as JSON data, never unpickled
            sandbox._parsed(reply)


def test_a_child_that_dies_runs_out_of_memory_or_time_is_reported_and_reaped():
    with pytest.raises(sandbox.ChildFailed, match="died.*SIGKILL"):
        sandbox.call_in_child(lambda: os.kill(os.getpid(), signal.SIGKILL), timeout_s=5)
    with pytest.raises(sandbox.ChildFailed, match="died"):
        sandbox.call_in_child(lambda: os._exit(3), timeout_s=5)
    with pytest.raises(sandbox.ChildFailed, match="memory limit"):
        sandbox.call_in_child(lambda: len(bytearray(8 * sandbox.MEMORY_HEADROOM_BYTES)), timeout_s=5)

    def spin() -> float:
        while True:
            pass

    with pytest.raises(sandbox.ChildFailed, match="time limit"):
        sandbox.call_in_child(spin, timeout_s=0.3)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child left behind


def test_the_child_leaves_the_parents_global_rngs_alone():
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    sandbox.call_in_child(lambda: random.random() + np.random.random() + len(random.sample(range(9), 3)), timeout_s=5)
    assert (random.random(), np.random.random()) == expected
