"""The verifiers bridge on verifiers' own classes: a single-turn taskset scored by weighted rewards, a multi-turn
env whose own run() drives the policy's seat, the bundled example, offline errors and RNG isolation."""

from __future__ import annotations

import json
import random
import time

import pytest
from skyrl_bridge_verifiers.env import VerifiersEnv
from skyrl_bridge_verifiers.peer import VerifiersDataError
from skyrl_core.catalog import catalog_entries
from skyrl_core.testing import check_adversarial, check_env

QUIZ = {"name": "vf_bridge_quiz:load_environment", "gold_template": "<answer>{answer}</answer>"}
GUESS = {"name": "vf_bridge_guess:load_environment", "gold_template": "<guess>{secret}</guess>", "max_turns": 4}


def _env(config: dict, row: int = 0) -> VerifiersEnv:
    rows = VerifiersEnv.load_dataset("train", VerifiersEnv.config_class(**config))
    return VerifiersEnv(rows[row], config)


def test_catalog_lists_the_builtin_tasksets_and_the_example():
    names = {entry.name for entry in catalog_entries("verifiers")}
    assert {"textarena", "harbor", "skyrl_bridge_verifiers.example:load_environment"} <= names
    assert "tinker_cookbook" not in names  # depends on verifiers only through an extra: not a taskset


@pytest.mark.parametrize("config", [QUIZ, {"name": "vf_bridge_quiz"}, GUESS, {}],
                         ids=["quiz-function", "quiz-taskset-id", "guess-multi-turn", "bundled-example"])
def test_check_env_passes(config):
    report = check_env("verifiers", config=config, n_tasks=2)
    gold = [check for check in report.passed if check.startswith("gold")]
    assert len(gold) == (0 if config == {"name": "vf_bridge_quiz"} else 2)  # the id form has no gold template


def test_reward_range_comes_from_the_reward_weights_and_can_be_overridden():
    assert _env(QUIZ).reward_range == (-0.5, 1.25)  # correct 1.0 + format 0.25, long_penalty -0.5
    assert _env(GUESS).reward_range == (-0.25, 1.0)
    assert _env({**QUIZ, "reward_range": [-1.0, 2.0]}).reward_range == (-1.0, 2.0)


def test_single_turn_reward_is_the_tasks_weighted_sum():
    env = _env(QUIZ)
    prompt, info = env.reset(seed=0)
    assert [m["role"] for m in prompt] == ["system", "user"] and "France" in prompt[1]["content"]
    result = env.step("It is <answer>Paris</answer>")
    assert result.terminated and result.reward == pytest.approx(1.25)
    assert result.info["rewards"] == {"correct": 1.0, "format": 1.0, "long_penalty": 0.0}
    env.reset(seed=0)
    assert env.step("<answer>Lyon</answer>" + " pad" * 120).reward == pytest.approx(0.25 - 0.5)  # range bottom side
    assert env.reward_ceiling() == pytest.approx(1.25)


def test_multi_turn_env_drives_the_policy_seat_turn_by_turn():
    env = _env(GUESS)
    secret = env.task["data"]["secret"]
    prompt, _ = env.reset(seed=0)
    assert prompt[-1]["content"].startswith("I picked a number")
    wrong = secret - 1 if secret > 1 else secret + 1
    step = env.step(f"<guess>{wrong}</guess>")
    assert step.reward == 0.0 and not step.terminated
    assert step.observation == [{"role": "user", "content": "Higher." if wrong < secret else "Lower."}]
    step = env.step("no idea")
    assert step.observation[-1]["content"].startswith("No <guess>")
    final = env.step(f"<guess>{secret}</guess>")
    assert final.terminated and final.reward == pytest.approx(1.0 - 0.25 / 3)  # one malformed reply in three


def test_turn_limit_ends_the_peer_loop_and_pays_its_reward_on_the_last_turn():
    env = _env({**GUESS, "max_turns": 2})
    env.reset(seed=0)
    assert not env.step("hmm").truncated
    last = env.step("still thinking")
    assert last.truncated and not last.terminated and last.info["stop"] == "max_turns"
    assert last.reward == pytest.approx(-0.25)  # malformed on both turns: the bottom of the range


def test_rejected_actions_reach_the_peer_as_empty_replies():
    env = _env({**GUESS, "max_turns": 2, "max_action_chars": 100})
    env.reset(seed=0)
    first = env.step("")
    assert first.info["invalid_action"] and first.observation[-1]["content"].startswith("No <guess>")
    last = env.step("x" * 101)
    assert last.truncated and last.reward == pytest.approx(-0.25)  # the peer's penalty, not a dodged 0
    quiz = _env(QUIZ)
    quiz.reset(seed=0)
    empty = quiz.step("  ")
    assert empty.terminated and empty.reward == 0.0 and empty.info["rewards"]["format"] == 0.0


def test_a_rejected_action_on_the_generators_async_path_reaches_the_peer_too():
    import asyncio

    env = _env({**GUESS, "max_turns": 2})

    async def episode() -> list[float]:
        await env.areset(seed=0)
        return [(await env.astep("")).reward, (await env.astep("")).reward]  # areject_action, awaited off-thread

    assert asyncio.run(episode()) == pytest.approx([0.0, -0.25])


def test_adversarial_flags_format_rewards_paid_without_the_answer():
    report = check_adversarial("verifiers", config=QUIZ, quick=True)
    flagged = {outcome.probe for outcome in report.flagged}
    # The format reward (0.25) pays any reply holding an <answer> tag: markup soup, the prompt echoed back.
    assert flagged == {"control_chars", "format_repeated", "echo"}, report.problems()
    assert not report.leaks
    guess = check_adversarial("verifiers", config=GUESS, quick=True)
    assert guess.ok, guess.problems()


def test_global_rng_is_isolated_and_a_seed_repeats_the_episode():
    def episode() -> list:
        env = _env(GUESS)
        prompt, _ = env.reset(seed=3)
        steps = [env.step(a) for a in ("<guess>3</guess>", "<guess>17</guess>")]
        env.close()
        return [prompt, *[(s.observation, s.reward) for s in steps]]

    random.seed(123)
    before = random.getstate()
    first = episode()  # the peer's run() draws from the process RNG; the bridge restores it
    assert random.getstate() == before
    assert episode() == first


def test_local_rows_from_data_files(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"name": "capital-chile", "prompt": "Capital of Chile?", "answer": "Santiago"}) + "\n")
    env = _env({**QUIZ, "data_files": str(rows)})
    assert env.task["name"] == "capital-chile"
    env.reset(seed=0)
    assert env.step(env.gold_actions()[0]).reward == pytest.approx(1.25)
    rows.write_text(json.dumps({"prompt": "no answer field"}) + "\n")
    with pytest.raises(ValueError, match="rows.jsonl:1: not a QuizData row"):
        _env({**QUIZ, "data_files": str(rows)})


def test_a_taskset_that_downloads_fails_with_one_clear_error():
    started = time.monotonic()
    with pytest.raises(VerifiersDataError, match="env.data_files"):
        VerifiersEnv.load_dataset("train", VerifiersEnv.config_class(name="vf_bridge_quiz:load_downloading"))
    assert time.monotonic() - started < 30


def test_builtin_textarena_needs_nltk_data_and_says_so():
    pytest.importorskip("textarena")
    pytest.importorskip("nltk")
    config = VerifiersEnv.config_class(name="textarena", args={"game": "Wordle-v0"}, max_rows=2)
    try:
        rows = VerifiersEnv.load_dataset("train", config)
    except VerifiersDataError as exc:
        assert "nltk" in str(exc)
    else:  # the corpora are installed on this machine: the game loads
        assert rows
