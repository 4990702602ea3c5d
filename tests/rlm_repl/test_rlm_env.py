"""Episodes of env rlm_repl against its real sandbox: blocks, answers, limits, sub-calls, check_env."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from rlm_helpers import CONTEXT_TASK, repl
from skyrl_core.testing import check_env
from skyrl_rlm_repl.env import RLMReplEnv


def text(result) -> str:
    return result.observation[0]["content"]


def test_variables_persist_across_turns(make_env):
    env = make_env()
    first = env.step(repl("x = 41"))
    assert "(no output)" in text(first) and not first.terminated
    assert "42" in text(env.step(repl("print(x + 1)")))


def test_all_blocks_run_in_order_in_one_turn(make_env):
    result = make_env().step("Plan.\n" + repl("word = 'first'") + "\nthen\n" + repl("print(word + ' second')"))
    assert result.info["blocks_run"] == 2
    assert "[block 1 of 2]" in text(result) and "first second" in text(result)


def test_final_in_code_ends_the_episode_and_skips_later_blocks(make_env):
    result = make_env().step(repl("FINAL('Paris')") + "\n" + repl("print('never')"))
    assert result.terminated and result.reward == 1.0 and result.observation == []
    assert result.info["final_answer"] == "Paris" and result.info["blocks_run"] == 1


def test_final_var_in_code_and_text_final_without_a_block(make_env):
    by_var = make_env().step(repl("city = 'Paris'", "FINAL_VAR('city')"))
    assert by_var.terminated and by_var.info["final_answer"] == "Paris"
    by_text = make_env().step("I know this one.\nFINAL(\"Paris\")")
    assert by_text.terminated and by_text.reward == 1.0
    wrong = make_env().step("FINAL(Lyon)")
    assert wrong.terminated and wrong.reward == 0.0


def test_text_final_var_reads_the_variable_after_the_blocks(make_env):
    result = make_env().step(repl("guess = context.split()[-1].rstrip('.')") + "\nFINAL_VAR(guess)")
    assert result.terminated and result.info["final_answer"] == "Paris" and result.reward == 1.0


def test_final_var_of_a_missing_variable_keeps_the_episode_going(make_env):
    result = make_env().step(repl("FINAL_VAR('nothing_here')"))
    assert not result.terminated and "'nothing_here' not found" in text(result)


def test_response_without_a_block_gets_a_clear_observation(make_env):
    env = make_env()
    result = env.step("Let me think about it.\n```python\nprint(1)\n```")
    assert "No ```repl block found" in text(result) and "only ```repl blocks run" in text(result)
    assert env.get_metrics()["no_block_turns"] == 1.0 and env.get_metrics()["executions"] == 0.0


def test_errors_from_code_are_shown_and_the_repl_survives(make_env):
    env = make_env()
    assert "ZeroDivisionError" in text(env.step(repl("y = 1", "1 / 0")))
    assert "ok" in text(env.step(repl("print('ok')")))
    assert env.get_metrics()["sandbox_errors"] == 1.0


def test_long_output_is_cut_with_a_note_of_how_much(make_env):
    env = make_env(max_output_chars=1000, sandbox={"max_output_chars": 100_000})
    result = env.step(repl("print('x' * 50_000)"))
    shown = text(result)
    assert "[output truncated: 49,001 more characters were not shown]" in shown
    assert shown.count("x") <= 1000 + 10
    assert env.get_metrics()["output_chars_cut"] == 49_001


def test_turn_limit_truncates_and_warns_on_the_last_turn(make_env):
    env = make_env(max_turns=2)
    first = env.step(repl("a = 1"))
    assert "1 response left: it must give the final answer" in text(first)
    second = env.step(repl("b = 2"))
    assert second.truncated and not second.terminated and second.reward == 0.0
    assert second.info["truncated_reason"] == "turn limit (2) reached"


def test_timeout_is_reported_and_the_repl_restarts(make_env):
    env = make_env(sandbox={"exec_timeout_s": 0.5})
    env.step(repl("kept = 1"))
    result = env.step(repl("while True:", "    pass"))
    assert "exceeded the 0.5 s time limit" in text(result) and "restarted" in text(result)
    assert text(result).count("restarted") == 1
    assert "NameError" in text(env.step(repl("print(kept)")))
    metrics = env.get_metrics()
    assert metrics["sandbox_timeouts"] == 1.0 and metrics["sandbox_restarts"] >= 1.0


def test_subcalls_without_rlm_tree_return_an_error_string_not_a_hang(make_env):
    env = make_env()
    result = env.step(repl("print(llm_query('hi'))", "print(rlm_query_batched(['a', 'b']))"))
    assert text(result).count("sub-calls need generator rlm_tree") == 3


def test_injected_subcall_handler_answers_the_code(make_env):
    seen = []

    async def handler(method, params):
        seen.append((method, params))
        await asyncio.sleep(0)
        return f"answer to {params['prompt']}"

    env = make_env()
    env.subcall_handler = handler
    assert "answer to ping" in text(env.step(repl("print(llm_query('ping'))")))
    assert seen == [("llm_query", {"prompt": "ping"})]


def test_a_raising_handler_becomes_an_error_string(make_env):
    async def broken(method, params):
        raise RuntimeError("engine down")

    env = make_env()
    env.subcall_handler = broken
    assert "Error: rlm_query failed: RuntimeError: engine down" in text(env.step(repl("print(rlm_query('x'))")))


def test_evidence_tools_and_gold_answer(make_env, evidence_tasks):
    task = evidence_tasks[0]
    env = make_env(task=task)
    listing = text(env.step(repl("ids = list_papers()", "print(len(ids))", "print(read_section(ids[0], 'Title'))")))
    assert all(paper in listing for paper in task["papers"])
    phrase = task["question"].split('"')[1]
    searched = text(env.step(repl(f"hits = search({phrase!r})", "search = None")))
    assert "[0] " in searched
    final = env.step(repl("FINAL([h['text'] for h in search(" + repr(phrase) + ")])"))  # tool restored
    assert final.terminated and final.reward == 1.0
    assert final.info["reward_components"]["grounded_fraction"] == 1.0
    assert env.get_metrics()["final_answer_given"] == 1.0


def test_reports_its_sandbox_backend(make_env):
    env = make_env()
    result = env.step(repl("print(1)"))
    assert result.info["sandbox_backend"] in ("bwrap", "subprocess")
    assert env.get_metrics()["sandbox_strong"] == float(result.info["sandbox_backend"] == "bwrap")


def test_sandbox_starts_lazily_and_close_is_idempotent(make_env):
    env = make_env()
    env.step("no code yet")
    assert env._sandbox is None
    env.step(repl("print(1)"))
    assert env._sandbox is not None
    env.close()
    env.close()
    assert env._sandbox is None


def test_reset_starts_a_fresh_repl(make_env):
    env = make_env()
    env.step(repl("secret = 7"))
    env.reset(seed=0)
    assert "NameError" in text(env.step(repl("print(secret)")))


def test_pickled_env_keeps_task_and_config_and_runs(make_env):
    env = make_env(max_turns=3)
    env.step(repl("x = 1"))
    clone = pickle.loads(pickle.dumps(env))
    try:
        assert clone.task == env.task and clone.config == env.config and clone._sandbox is None
        clone.reset(seed=0)
        assert clone.step(repl("FINAL('Paris')")).reward == 1.0
    finally:
        clone.close()


async def test_astep_from_a_running_loop_works_with_a_handler_on_that_loop():
    loop = asyncio.get_running_loop()

    async def handler(method, params):
        assert asyncio.get_running_loop() is loop  # injected handlers run on the caller's loop
        return "from the caller loop"

    env = RLMReplEnv(task=CONTEXT_TASK, subcall_handler=handler)
    await asyncio.to_thread(env.reset, seed=0)
    try:
        result = await env.astep(repl("print(llm_query('q'))"))
        assert "from the caller loop" in text(result)
    finally:
        await asyncio.to_thread(env.close)


def test_task_without_a_question_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a non-empty 'question' or 'prompt'"):
        RLMReplEnv(task={"context": "x"}).reset()


def test_check_env_passes():
    report = check_env("rlm_repl", n_tasks=2)
    assert not report.failed and "gold[row 2]" in report.passed


def test_check_env_passes_on_context_and_answer_tasks():
    report = check_env("rlm_repl", tasks=[CONTEXT_TASK, {**CONTEXT_TASK, "answer": "it's (really) Paris"}])
    assert not report.failed and "gold[row 2]" in report.passed


@pytest.mark.parametrize("backend", ["bwrap", "subprocess"])
def test_episode_runs_on_the_configured_backend(make_env, backend):
    if backend == "bwrap":
        from skyrl_sandbox.testing import require_backend

        require_backend("bwrap")
    env = make_env(sandbox={"backend": backend})
    env.step(repl("import json", "data = json.dumps({'city': context.split()[-1]})"))
    result = env.step(repl("FINAL(json.loads(data)['city'].rstrip('.'))"))
    assert result.info["sandbox_backend"] == backend and result.reward == 1.0
