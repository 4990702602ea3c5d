"""The openenv bridge in process: conformance and probes on two OpenEnv envs written with OpenEnv's base classes,
actions parsed from text into typed actions, observation rendering, RNG isolation, errors, the catalogue, and
OpenEnv's own template env (whose reward is the reply's length: a reward bug the checkers catch)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from skyrl_core.catalog import catalog_entries
from skyrl_core.testing import check_adversarial, check_env

ECHO = {"name": "bridge_openenv_toys:EchoEnvironment", "max_turns": 3}
GUESS = {"name": "bridge_openenv_toys:GuessEnvironment", "max_turns": 7}


@pytest.fixture(autouse=True)
def _toys(toys_on_path):
    import bridge_openenv_toys

    bridge_openenv_toys.EchoEnvironment.RECEIVED.clear()
    bridge_openenv_toys.GuessEnvironment.RECEIVED.clear()
    return bridge_openenv_toys


def make(config, seed=0, task=None):
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(task=task or {}, config=config)
    prompt, info = env.reset(seed=seed, options={"task": task or {}})
    return env, prompt, info


@pytest.mark.parametrize("config", [{}, ECHO, GUESS], ids=["demo", "echo", "guess"])
def test_check_env_passes_and_gold_reaches_the_ceiling(config):
    report = check_env("openenv", config=config, n_tasks=2)
    assert not report.failed
    assert {"gold[row 1]", "gold[row 2]", "episode:wrong_then_gold", "determinism", "pickle"} <= set(report.passed)


@pytest.mark.parametrize("config", [ECHO, GUESS], ids=["echo", "guess"])
def test_check_adversarial_quick_finds_nothing_to_game(config):
    report = check_adversarial("openenv", config=config, quick=True)
    assert report.ok, report.problems()
    assert {o.probe for o in report.outcomes} >= {"near_miss", "gold_hedged", "echo", "empty_last"}


def test_the_reward_range_comes_from_the_env_class_or_the_config():
    from skyrl_bridge_openenv.config import OpenEnvConfig
    from skyrl_bridge_openenv.env import OpenEnvEnv

    assert OpenEnvEnv.reward_range_for(OpenEnvConfig(**GUESS)) == (-0.7, 1.0)
    assert OpenEnvEnv.reward_range_for(OpenEnvConfig(**GUESS, reward_range=(-1, 2))) == (-1.0, 2.0)


def test_a_json_action_is_parsed_and_text_that_makes_none_never_reaches_the_env(_toys):
    env, prompt, _ = make({**GUESS, "max_turns": 10}, task={"seed": 5})
    assert "guess (integer, required): Your guess" in prompt[0]["content"]  # the model is told the fields
    bad = ["I think 50", '{"guess": "fifty"}', '{"guess": 50, "metadata": {"x": 1}}', '{"guess": 1} {"guess": 2}',
           "[50]", '{"guess": 0}']
    for text in bad:
        result = env.step(text)
        assert result.reward == 0.0 and not result.terminated and result.info["invalid_action"]
        assert "guess (integer, required)" in result.observation[0]["content"]
    assert _toys.GuessEnvironment.RECEIVED == []
    assert env.get_metrics()["invalid_actions"] == len(bad)
    assert env.step('Sure! ```json\n{"guess": 50}\n```').info == {}  # fenced, in prose: one object, accepted
    assert env.step('My guess is {"guess": 25} final.').info == {}
    assert [a.guess for a in _toys.GuessEnvironment.RECEIVED] == [50, 25]


def test_an_invalid_reply_on_the_last_turn_scores_the_bottom_of_the_range():
    env, _, _ = make({**GUESS, "max_turns": 2}, task={"seed": 5})
    first = env.step('{"guess": 1000}')  # valid and (for seed 5) wrong: the env's own -0.1
    assert first.reward == pytest.approx(-0.1)
    last = env.step("no idea")
    assert last.truncated and first.reward + last.reward == pytest.approx(-0.7)


def test_a_single_string_field_takes_the_raw_text_and_rewards_are_per_step(_toys):
    env, prompt, _ = make(ECHO, task={"seed": 1})
    gold = env.gold_actions()
    assert prompt[0]["content"].startswith(f"Echo this word back exactly: {gold[0]}")
    assert env.step('{"message": "x"}').reward == 0.0  # raw text: JSON is just text here
    assert _toys.EchoEnvironment.RECEIVED[-1].message == '{"message": "x"}'
    empty = env.step("  ")  # rejected before the env: it has no penalty of its own, so 0 and counted
    assert empty.reward == 0.0 and empty.info["invalid_action"] and len(_toys.EchoEnvironment.RECEIVED) == 1
    assert env.get_metrics()["invalid_actions"] == 1
    env, _, _ = make({**ECHO, "max_turns": 5}, task={"seed": 1})
    one, two = env.step(gold[0]), env.step(gold[1])
    assert (one.reward, one.terminated, two.reward, two.terminated) == (0.5, False, 0.5, True)
    assert two.observation == [{"role": "user", "content": "All words echoed."}]


def test_observations_render_their_text_field_else_the_json_of_their_fields():
    _, prompt, _ = make(GUESS, task={"seed": 5})
    assert prompt[0]["content"].startswith('{"feedback": "I picked a number from 1 to 100.", "guesses_left": 7}')
    _, prompt, _ = make({**GUESS, "render": "feedback", "instructions": False}, task={"seed": 5})
    assert prompt == [{"role": "user", "content": "I picked a number from 1 to 100."}]
    _, prompt, _ = make({**ECHO, "render": "json", "instructions": False}, task={"seed": 1})
    assert prompt[0]["content"].startswith('{"text": "Echo this word back exactly: ')


def test_env_args_reach_the_constructor():
    env, prompt, _ = make({**GUESS, "args": {"high": 3}}, task={"seed": 5})
    assert "from 1 to 3." in prompt[0]["content"]
    assert int(env.gold_actions()[0].split(":")[1].strip(" }")) in (1, 2, 3)


def test_the_process_rng_is_untouched_and_the_seed_fixes_the_episode():
    random.seed(1234)
    np.random.seed(99)
    before, np_before = random.getstate(), np.random.get_state()
    for config in (ECHO, GUESS):
        env, _, _ = make(config, seed=3)
        env.step(env.gold_actions()[0])
        env.close()
    assert random.getstate() == before
    after = np.random.get_state()
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(after, np_before, strict=True))

    def golds(seed, task=None):
        env, _, _ = make(GUESS, seed=seed, task=task)
        return env.gold_actions()

    assert golds(3) == golds(3)
    assert len({golds(seed)[0] for seed in range(6)}) > 1
    assert golds(1, {"seed": 42}) == golds(2, {"seed": 42})  # a row's seed is the episode: GRPO groups agree


def test_dataset_rows_are_seeds_and_splits_do_not_overlap():
    from skyrl_bridge_openenv.config import OpenEnvConfig
    from skyrl_bridge_openenv.env import OpenEnvEnv

    config = OpenEnvConfig(**GUESS, train_tasks=3, test_tasks=2)
    train, test = OpenEnvEnv.load_dataset("train", config), OpenEnvEnv.load_dataset("test", config)
    assert [r["seed"] for r in train] == [0, 1, 2] and len(test) == 2
    assert not {r["seed"] for r in train} & {r["seed"] for r in test}


def test_unusable_names_fail_at_make_time_with_one_clear_error():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    with pytest.raises(ValueError, match="no OpenEnv env 'nosuch'.*installed OpenEnv env package.*Nothing is downl"):
        OpenEnvEnv(config={"name": "nosuch"})
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        OpenEnvEnv(config={"name": "no_such_module:Env"})
    with pytest.raises(ValueError, match="not a subclass of OpenEnv's"):
        OpenEnvEnv(config={"name": "bridge_openenv_toys:EchoAction"})


def test_an_env_that_cannot_be_built_fails_reset_with_its_own_message():
    from skyrl_bridge_openenv.env import OpenEnvEnv

    env = OpenEnvEnv(config={"name": "bridge_openenv_toys:BrokenEnvironment"})
    with pytest.raises(RuntimeError, match="needs a data file that is not here"):
        env.reset(seed=0)
    with pytest.raises(ValueError, match="do not fit EchoEnvironment"):
        make({**ECHO, "args": {"nope": 1}})


def test_the_catalogue_lists_the_demo_and_installed_openenv_envs(template_env):
    names = [entry.name for entry in catalog_entries("openenv")]
    assert "demo" in names and template_env in names


def test_openenv_init_template_env_rewards_reply_length_and_the_checkers_say_so(template_env):
    """OpenEnv's template env (what `openenv init` generates) pays 0.1 per character of every message, every step,
    and never ends: no range holds it, and longer replies score more. Run by its installed name."""
    config = {"name": template_env, "max_turns": 3}
    env, prompt, _ = make(config)  # its reset() takes no seed: the bridge passes only what reset() accepts
    assert "environment ready!" in prompt[0]["content"]
    assert env.step("abcd").reward == pytest.approx(0.4)
    report = check_env("openenv", config=config, raise_on_failure=False)
    assert any("outside reward_range" in failure for failure in report.failed)
    probes = check_adversarial("openenv", config=config, quick=True)
    assert "echo" in {outcome.probe for outcome in probes.flagged}
