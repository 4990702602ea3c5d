"""The reasoning_gym bridge: reasoning-gym's datasets as one-turn envs scored by their own score_answer."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("reasoning_gym")

from skyrl_bridge_reasoning_gym import peer  # noqa: E402
from skyrl_bridge_reasoning_gym.answer import extract_answer  # noqa: E402
from skyrl_bridge_reasoning_gym.config import ReasoningGymConfig  # noqa: E402
from skyrl_bridge_reasoning_gym.env import INSTRUCTION, ReasoningGymEnv  # noqa: E402
from skyrl_bridge_reasoning_gym.guard import admissible  # noqa: E402
from skyrl_core.catalog import catalog_entries  # noqa: E402
from skyrl_core.factory import ConfigError, validate_config  # noqa: E402
from skyrl_core.testing import check_adversarial, check_env  # noqa: E402

ENV = "reasoning_gym"


def config(name: str, **args) -> ReasoningGymConfig:
    return ReasoningGymConfig(name=name, args=args)


def first_env(name: str, max_turns: int = 1, scorer_timeout_s: float = 5.0, **args) -> tuple[ReasoningGymEnv, dict]:
    cfg = ReasoningGymConfig(name=name, args={"size": 2, **args}, max_turns=max_turns,
                             scorer_timeout_s=scorer_timeout_s)
    row = ReasoningGymEnv.load_dataset("train", cfg)[0]
    env = ReasoningGymEnv(task=row, config=cfg)
    env.reset(seed=0, options={"task": row})
    return env, row


# -- catalogue and config ---------------------------------------------------------------------------------


def test_the_catalogue_lists_every_registered_dataset():
    from reasoning_gym.factory import DATASETS

    entries = {entry.name: entry for entry in catalog_entries(ENV)}
    assert set(entries) == set(DATASETS) and len(entries) > 100
    assert entries["gcd"].reward_range == (0.0, 1.0) and entries["gcd"].max_turns == 1
    assert "arithmetic" in entries["gcd"].tags and "Greatest Common Divisor" in entries["gcd"].description
    assert "needs env.args.datasets" in entries["composite"].tags
    assert "open-ended: no gold answer" in entries["graph_color"].tags


@pytest.mark.parametrize(("values", "expected"), [
    ({"name": "gcdd"}, "Did you mean 'gcd'?"),
    ({"name": "gcd", "args": {"max_valeu": 5}}, "env.args.max_valeu: unknown option"),
    ({"name": "gcd", "args": {"max_valeu": 5}}, "Did you mean 'max_value'?"),
    ({"name": "gcd", "args": {"min_value": "many"}}, "env.args.min_value: Input should be a valid integer"),
    ({"name": "gcd", "args": {"min_numbers": 1}}, "rejected its options"),
    ({"name": "gcd", "args": {"size": 0}}, "env.args.size: must be a whole number from 1"),
    ({"name": "composite"}, "env.args.datasets: reasoning-gym's 'composite' mixes datasets you list"),
    ({"name": "composite", "args": {"datasets": [{"name": "gcd", "weight": 0}]}}, "env.args.datasets[0].weight"),
    ({"name": "composite", "args": {"datasets": [{"name": "gcdd"}]}}, "Did you mean 'gcd'?"),
    ({"name": "composite", "args": {"datasets": [{"name": "gcd", "config": {"max_valeu": 3}}]}},
     "env.args.datasets[0].config.max_valeu: unknown option"),
    ({"name": "composite", "args": {"datasets": [{"name": "gcd"}, {"name": "gcd"}]}}, "listed 2 times"),
    ({"name": "composite", "args": {"datasets": [{"name": "gcd", "wieght": 2}]}}, "datasets[0].wieght"),
])
def test_bad_options_are_named(values, expected):
    with pytest.raises(ConfigError) as caught:
        validate_config(ReasoningGymConfig, values, "env")
    assert expected in str(caught.value)


# -- the answer rule and the reward -------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "answer"), [
    ("thinking... <answer> 42 </answer>", "42"),
    ("<answer></answer>", ""),
    ("no tags at all", None),
    ("<answer>41</answer> or <answer>42</answer>", None),  # several blocks: no answer
    ("</answer>42<answer>", None),
    ("<answer>unterminated", None),
    ("<answer><answer>42</answer>", None),
    ("<ANSWER>42</ANSWER>", None),
])
def test_exactly_one_answer_block_is_read(reply, answer):
    assert extract_answer(reply) == answer


def test_the_prompt_is_the_peers_question_and_holds_no_answer_block_of_its_own():
    env, row = first_env("gcd")
    prompt = env.build_prompt()
    assert prompt[-1] == {"role": "user", "content": row["question"]} and prompt[0]["content"] == INSTRUCTION
    assert extract_answer("\n".join(m["content"] for m in prompt)) is None
    env.config = env.config.model_copy(update={"system_prompt": False})
    (only,) = env.build_prompt()
    assert only["content"].startswith(row["question"]) and only["content"].endswith(INSTRUCTION)


def test_reward_is_the_datasets_score_of_the_one_answer():
    env, row = first_env("gcd")
    assert env.gold_actions() == [f"<answer>{row['answer']}</answer>"] and env.reward_ceiling() == 1.0
    result = env.step(f"The GCD is <answer>{row['answer']}</answer>")
    assert (result.reward, result.terminated, result.info["answer"]) == (1.0, True, row["answer"])
    assert env.get_metrics() == {"score": 1.0, "answered": 1.0, "correct": 1.0, "scorer_refused": 0.0,
                                 "scorer_timeouts": 0.0}
    wrong = str(int(row["answer"]) + 1)
    for reply in (f"<answer>{wrong}</answer>", f"<answer>{wrong}</answer><answer>{row['answer']}</answer>"):
        env.reset(seed=0, options={"task": row})
        assert env.step(reply).reward == 0.0


def test_a_missing_or_rejected_answer_gets_the_peers_own_missing_answer_score():
    """countdown gives 0.01 to a missing answer: a reply without tags and an empty (rejected) reply both get it."""
    env, row = first_env("countdown")
    missing = env._score(None)
    assert missing == pytest.approx(0.01)
    assert env.step("I do not know.").reward == missing
    env.reset(seed=0, options={"task": row})
    rejected = env.step("   ")
    assert rejected.reward == missing and rejected.terminated and "invalid_action" in rejected.info
    env.reset(seed=0, options={"task": row})
    assert env.step(env.gold_actions()[0]).reward == 1.0


def test_more_turns_let_a_reply_without_tags_try_again():
    env, row = first_env("gcd", max_turns=2)
    first = env.step("Let me think about the divisors.")
    assert first.reward == 0.0 and not (first.terminated or first.truncated)
    assert "no answer tags" in first.observation[0]["content"]
    assert env.step(f"<answer>{row['answer']}</answer>").reward == 1.0 and env.done
    env.reset(seed=0, options={"task": row})
    assert env.step("").reward == 0.0 and not env.done  # rejected with a turn left: told so
    last = env.step("x" * (env.config.max_action_chars + 1))
    assert last.terminated and last.reward == env._score(None)


def test_a_ceiling_below_one_is_declared_and_reached(monkeypatch):
    """Where a dataset scores its own answer below 1, the task's ceiling is that score and the gold reaches it."""
    env, row = first_env("gcd")
    real = peer.score
    monkeypatch.setattr(peer, "score", lambda *a, **k: 0.5 * real(*a, **k))
    env.reset(seed=0, options={"task": row})
    assert env.reward_ceiling() == 0.5 and env.gold_actions()
    assert env.step(env.gold_actions()[0]).reward == 0.5 and env.get_metrics()["correct"] == 1.0


def test_open_ended_datasets_have_no_gold_and_a_ceiling_of_one():
    env, row = first_env("graph_color")
    assert row["answer"] is None and env.gold_actions() is None and env.reward_ceiling() == 1.0


# -- rows ---------------------------------------------------------------------------------------------------


def test_rows_are_json_deterministic_and_the_splits_are_disjoint():
    cfg = ReasoningGymConfig(name="gcd", args={"size": 20, "seed": 3}, test_size=7)
    train, test = ReasoningGymEnv.load_dataset("train", cfg), ReasoningGymEnv.load_dataset("test", cfg)
    assert (len(train), len(test)) == (20, 7)
    assert json.loads(json.dumps(train)) == train and train[0]["name"] == "gcd-train-0"
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    peer._rows.cache_clear()
    assert ReasoningGymEnv.load_dataset("train", cfg) == train
    assert ReasoningGymEnv.load_dataset("train", config("gcd", size=20, seed=4))[0] != train[0]
    assert len(ReasoningGymEnv.load_dataset("train", ReasoningGymConfig(name="gcd"))) == peer.DEFAULT_TRAIN_SIZE
    with pytest.raises(ValueError, match="'train' and 'test'"):
        ReasoningGymEnv.load_dataset("validation", cfg)


def test_metadata_json_would_change_is_scored_from_the_peers_own_entry():
    """arc_agi's metadata holds tuples and gsm_symbolic's Fractions: the row is JSON, the score uses the peer's entry."""
    for name in ("arc_agi", "gsm_symbolic"):
        env, row = first_env(name)
        json.dumps(row)
        assert env.step(env.gold_actions()[0]).reward == 1.0


def test_a_row_without_its_source_is_scored_from_its_own_fields():
    _, row = first_env("gcd")
    bare = {key: row[key] for key in ("name", "question", "answer", "metadata")}
    env = ReasoningGymEnv(task=bare, config=config("gcd"))
    env.reset(seed=0)
    assert env.step(f"<answer>{row['answer']}</answer>").reward == 1.0


def test_a_row_of_another_dataset_is_refused_by_name():
    _, row = first_env("gcd")
    env = ReasoningGymEnv(task=row, config=config("lcm"))
    with pytest.raises(ValueError, match="row of reasoning-gym dataset 'gcd', but env.name is 'lcm'"):
        env.reset(seed=0)


def test_without_a_row_each_seed_makes_its_own_task():
    env = ReasoningGymEnv(config=config("gcd"))
    first, _ = env.reset(seed=5)
    assert env.reset(seed=5)[0] == first and env.reset(seed=6)[0] != first
    assert env.step(env.gold_actions()[0]).reward == 1.0


def test_composite_mixes_the_named_datasets():
    args = {"size": 12, "datasets": [{"name": "gcd", "weight": 1}, {"name": "spell_backward", "weight": 1,
                                                                        "config": {"min_word_len": 4}}]}
    rows = ReasoningGymEnv.load_dataset("train", config("composite", **args))
    assert {row["source_dataset"] for row in rows} == {"gcd", "spell_backward"}
    check_env(ENV, config={"name": "composite", "args": args}, n_tasks=3)


# -- peer isolation and missing data ------------------------------------------------------------------------


def test_the_processs_global_rngs_are_untouched():
    """pool_matrix seeds numpy's global generator (np.random.seed): the bridge puts both global states back."""
    random.seed(123)
    np.random.seed(123)
    expected = (random.random(), np.random.random())
    random.seed(123)
    np.random.seed(123)
    peer._rows.cache_clear()
    peer._dataset.cache_clear()
    env, row = first_env("pool_matrix")
    env.step(env.gold_actions()[0])
    env.reset(seed=1)
    assert (random.random(), np.random.random()) == expected


def test_a_dataset_that_needs_a_missing_file_fails_with_one_clear_error():
    cfg = config("spell_backward", data_file="no_such_words.txt", size=2)
    with pytest.raises(peer.DatasetUnavailable, match="'spell_backward' cannot be built offline.*no_such_words"):
        ReasoningGymEnv.load_dataset("train", cfg)


# -- conformance and adversarial ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gcd", "spell_backward", "mini_sudoku", "knights_knaves", "codeio", "graph_color",
                                  "arc_1d", "ab"])
def test_check_env_passes(name):
    check_env(ENV, config={"name": name, "args": {"size": 2}}, n_tasks=2)


def test_check_adversarial_finds_the_peers_lenient_scorers():
    """Real findings in reasoning-gym 0.1.25's score_answer (see the README):

    - gcd uses the default scorer, which pays len(gold)/len(answer) when the gold is a substring of the answer:
      wrong answers around the right one in one block earn partial credit (hedged_in_block);
    - spell_backward pays a right answer followed by anything ~1.0: its 0.2 penalty for extra text is skipped
      when the per-letter float sum misses 1.0 exactly (gold_then_wrong);
    - decimal_arithmetic parses one number and is not gamed by these probes.
    """
    flagged = {}
    for name in ("gcd", "spell_backward", "decimal_arithmetic"):
        report = check_adversarial(ENV, config={"name": name, "args": {"size": 4}}, n_tasks=4, quick=True)
        flagged[name] = {outcome.probe for outcome in report.flagged}
        assert not report.leaks
    assert flagged == {"gcd": {"hedged_in_block"}, "spell_backward": {"gold_then_wrong"}, "decimal_arithmetic": set()}


# -- model text never runs as Python ---------------------------------------------------------------------

EVALUATING = ["binary_matrix", "n_queens", "spiral_matrix", "string_insertion", "countdown", "puzzle24",
              "polynomial_multiplication", "simple_integration", "intermediate_integration"]
HUGE = ["((((2^64)^64)^64)^64)^64", "(((2**64)**64)**64)**64", "2^(64*64*64*64*64)", "2**(64*64*64*64*64)",
        "2**(8*8*8*8*8*8*8*8)", "9**9**9**9"]


@pytest.mark.parametrize("name", EVALUATING)
def test_an_answer_the_peers_scorer_would_eval_never_runs(name, tmp_path):
    """reasoning-gym 0.1.25 scores these datasets with eval() or sympy.parse_expr() on the model's answer: code and
    power towers are scored as a missing answer before they reach it; the gold answer still scores 1."""
    import builtins

    env, row = first_env(name)
    missing = env._score(None)
    marker = f"skyrl_rg_ran_{name}"
    result = env.step(f"<answer>__import__('builtins').__setattr__('{marker}', 1)</answer>")
    assert not hasattr(builtins, marker) and result.reward == missing and "score_error" in result.info
    assert env.get_metrics()["scorer_refused"] == 1.0
    created = tmp_path / "ran"
    env.reset(seed=0, options={"task": row})
    assert env.step(f"<answer>__import__('os').system('touch {created}')</answer>").reward == missing
    assert not created.exists()
    for answer in HUGE:
        env.reset(seed=0, options={"task": row})
        assert env.step(f"<answer>{answer}</answer>").reward == missing
        assert env.get_metrics()["scorer_refused"] == 1.0
    env.reset(seed=0, options={"task": row})
    assert env.step(env.gold_actions()[0]).reward == 1.0


@pytest.mark.parametrize("name", ["countdown", "polynomial_multiplication", "n_queens"])
def test_without_the_guard_the_child_process_still_bounds_the_scorer(name, monkeypatch):
    """The guard is the cheap path, not the bound: with it switched off, towers and products in the exponent are
    scored in a child with memory, CPU and time limits, which is stopped; the episode gets the missing score."""
    from skyrl_bridge_reasoning_gym import env as env_module

    monkeypatch.setattr(env_module, "admissible", lambda dataset, answer: True)
    env, row = first_env(name, scorer_timeout_s=1.0)
    missing = env._score(None)
    for answer in ("(((2**64)**64)**64)**64**64", "2**(64*64*64*64*64)", "9**9**9**9", "[1] * 10**10"):
        env.reset(seed=0, options={"task": row})
        result = env.step(f"<answer>{answer}</answer>")
        assert result.reward == missing and "error" not in result.info
    assert env.get_metrics()["scorer_timeouts"] in (0.0, 1.0) and env.get_metrics()["scorer_refused"] == 0.0


def _grid(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


REWRITTEN = {  # the gold answer written another way, and what the dataset's scorer pays for that
    "binary_matrix": (lambda gold: repr([[int(x) for x in row] for row in _grid(gold)]), 0.1),
    "n_queens": (lambda gold: repr(_grid(gold)), 0.5),
    "spiral_matrix": (lambda gold: repr([int(x) for x in gold.split()]), 0.1),
    "string_insertion": (lambda gold: repr(list(gold)), 0.1),
    "countdown": (lambda gold: f"({gold})", 1.0),
    "puzzle24": (lambda gold: f"({gold})", 1.0),
    "polynomial_multiplication": (lambda gold: f"({gold})", 1.0),
    "simple_integration": (lambda gold: f"({gold})", 1.0),
    "intermediate_integration": (lambda gold: f"({gold})", 1.0),
}


@pytest.mark.parametrize("name", EVALUATING)
def test_an_answer_scored_in_the_child_process_gets_the_scorers_own_score(name):
    """An admitted answer that is not the gold text is scored in the child: the scorer's eval/parse_expr runs
    there and its score comes back (the literal forms earn the scorers' partial credit)."""
    env, row = first_env(name)
    rewrite, expected = REWRITTEN[name]
    answer = rewrite(row["answer"])
    if not admissible(name, answer):  # intermediate_integration's gold can hold an unevaluated Integral
        pytest.skip(f"{name}'s gold answer {row['answer']!r} is refused by the guard")
    assert env.step(f"<answer>{answer}</answer>").reward == pytest.approx(expected)
    assert env.get_metrics()["scorer_timeouts"] == 0.0 and env.get_metrics()["scorer_refused"] == 0.0


def test_a_scorer_that_hangs_is_stopped_and_scores_the_missing_answer(monkeypatch):
    import time

    env, row = first_env("countdown", scorer_timeout_s=0.5)
    missing = env._score(None)
    dataset_class = type(peer.dataset(*env._scorer))
    real = dataset_class.score_answer

    def hang(self, answer, entry):  # hangs on any answer but none and the gold one (those are scored here)
        if answer is None or answer == entry["answer"]:
            return real(self, answer, entry)
        while True:
            time.sleep(60)

    monkeypatch.setattr(dataset_class, "score_answer", hang)
    result = env.step("<answer>1 + 2</answer>")
    assert result.reward == missing and result.terminated and "time limit" in result.info["score_error"]
    assert env.get_metrics()["scorer_timeouts"] == 1.0
    env.reset(seed=0, options={"task": row})
    assert env.step(env.gold_actions()[0]).reward == 1.0  # the gold text is scored in this process


def test_a_scorer_that_raises_on_malformed_text_scores_a_missing_answer():
    """prime_factorization's scorer raises ValueError on 'x33': a wrong answer, not an env error."""
    env, _ = first_env("prime_factorization")
    result = env.step("<answer>x33</answer>")
    assert "error" not in result.info and result.reward == env._score(None) and "ValueError" in result.info["score_error"]
