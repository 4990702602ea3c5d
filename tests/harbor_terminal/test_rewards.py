"""Rewards as Harbor keeps them: a dict of named numbers, one scalar by our documented rule, every key logged.

``parse_reward`` is pure: every case of the rule, and hostile files (huge numbers, NaN, deep nesting,
10k keys, duplicate keys, a top level that is no object), run without a machine. Then a three-key
task of our own on each machine backend: the oracle scores the weighted value, doing nothing scores
0, each key reaches ``info`` and the ``reward/<key>`` metrics (and through the generator, the
sample records and the ``env/reward/<key>`` means), and a reward file the agent writes counts for
nothing.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from harbor_helpers import bash, play, write_task
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_harbor_terminal.rewards import MAX_KEY_CHARS, MAX_KEYS, parse_reward, weights_problem
from skyrl_harbor_terminal.task import TaskFormatError, load_task

WEIGHTS = {"correctness": 0.7, "performance": 0.3}


def reading(data: Any, weights: dict[str, float] | None = None, raw: bytes | None = None):
    return parse_reward(None, raw if raw is not None else json.dumps(data).encode(), weights)


# -- the rule -------------------------------------------------------------------------------------------------------


def test_reward_txt_is_the_reward_key() -> None:
    result = parse_reward(b"0.25\n", b'{"reward": 1}', WEIGHTS)  # reward.txt wins, and weights do not apply
    assert (result.reward, result.source, result.problem, result.rewards) == (0.25, "reward.txt", None,
                                                                              {"reward": 0.25})


@pytest.mark.parametrize(("text", "reward", "problem"), [
    (b"7", 1.0, "reward.txt holds 7, clipped to [0, 1]"),
    (b"-2", 0.0, "reward.txt holds -2, clipped to [0, 1]"),
    (b"nan", 0.0, "reward.txt holds nan, not a finite number"),
    (b"1e400", 0.0, "reward.txt holds inf, not a finite number"),
    (b"passed!", 0.0, "reward.txt does not hold a number: 'passed!'"),
])
def test_reward_txt_problems(text: bytes, reward: float, problem: str) -> None:
    result = parse_reward(text, None)
    assert result.reward == reward and problem in result.problem


def test_nothing_written_is_zero() -> None:
    result = parse_reward(None, None)
    assert result.reward == 0.0 and result.source is None and result.rewards == {}
    assert "wrote no /logs/verifier/reward.txt or reward.json" in result.problem


def test_a_reward_key_is_the_reward_and_the_others_are_logged() -> None:
    result = reading({"reward": 0.5, "tests": 2, "passed": 3, "note": "ok"}, WEIGHTS)
    assert result.reward == 0.5 and result.source == "reward.json" and result.problem is None
    assert result.rewards == {"reward": 0.5, "tests": 1.0, "passed": 1.0}  # clipped; text is left out


def test_without_weights_the_keys_count_equally() -> None:
    assert reading({"score": 0.25}).reward == 0.25
    result = reading({"a": 1, "b": 0.5, "c": 0})
    assert result.reward == 0.5 and result.problem is None and result.rewards == {"a": 1.0, "b": 0.5, "c": 0.0}


def test_weights_give_the_weighted_mean() -> None:
    result = reading({"correctness": 1, "performance": 0.5}, WEIGHTS)
    assert math.isclose(result.reward, 0.85) and result.problem is None
    assert result.rewards == {"correctness": 1.0, "performance": 0.5}


def test_a_weighted_key_missing_counts_zero_and_says_so() -> None:
    result = reading({"correctness": 1}, WEIGHTS)
    assert math.isclose(result.reward, 0.7)
    assert "the weighted key 'performance' is missing: it counts 0" in result.problem
    assert result.rewards == {"correctness": 1.0, "performance": 0.0}


def test_keys_without_a_weight_are_logged_with_weight_zero() -> None:
    result = reading({"style": 0, "correctness": 1, "performance": 1}, WEIGHTS)
    assert result.reward == 1.0 and result.problem is None
    assert result.rewards == {"correctness": 1.0, "performance": 1.0, "style": 0.0}
    assert reading({"a": 0.5, "b": 1}, {"a": 1, "b": 0}).reward == 0.5  # a zero weight counts nothing


@pytest.mark.parametrize(("value", "said"), [
    ("1", "holds str '1', not a number"), (True, "holds bool 'True', not a number"),
    (None, "holds NoneType 'None', not a number"), (1e400, "holds inf, not a finite number"),
])
def test_a_value_that_is_no_finite_number_counts_zero_and_is_named(value: Any, said: str) -> None:
    result = reading({"a": value, "b": 1})
    assert result.reward == 0.5 and f"reward.json key 'a' {said}: it counts 0" in result.problem
    assert result.rewards == {"a": 0.0, "b": 1.0}


def test_values_are_clipped_and_a_clip_that_counts_is_named() -> None:
    result = reading({"a": 3, "b": -1})
    assert result.reward == 0.5 and result.rewards == {"a": 1.0, "b": 0.0}
    assert "key 'a' holds 3, clipped to [0, 1]" in result.problem and "key 'b' holds -1" in result.problem


def test_a_bare_number_is_the_reward() -> None:
    assert reading(0.75).rewards == {"reward": 0.75} and reading(0.75).reward == 0.75


def test_key_names_are_made_safe_unique_and_short() -> None:
    long = "k" * 200
    result = reading({"a b": 1, "a_b": 0, "x/y": 0.5, "": 1, long: 1, "ü": 0})
    assert list(result.rewards) == ["a_b", "a_b_2", "x_y", "_", "k" * MAX_KEY_CHARS, "__2"]


# -- hostile files ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "problem"), [
    (b'{"reward": ', "reward.json is not JSON"),
    (b"\xff\xfe\x00garbage", "reward.json is not JSON"),
    (b"[1, 2]", "its top level is a list, not an object of named numbers"),
    (b'"1"', "its top level is a str"),
    (b"null", "its top level is a NoneType"),
    (b"{}", "reward.json is an empty object"),
    (b'{"a": {"reward": 1}}', "key 'a' holds a nested object"),
    (b'{"a": [1]}', "key 'a' holds a nested array"),
    (b'{"reward": 0, "reward": 1}', "the key 'reward' appears twice"),
    (b'{"a": 1, "b": {"c": 1, "c": 2}}', "the key 'c' appears twice"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
])
def test_refused_files_give_zero(raw: bytes, problem: str) -> None:
    result = reading(None, raw=raw)
    assert result.reward == 0.0 and result.source is None and result.rewards == {}
    assert problem in result.problem


@pytest.mark.parametrize("raw", [b'{"a": NaN, "b": 1}', b'{"a": Infinity, "b": 1}', b'{"a": -Infinity, "b": 1}',
                                 b'{"a": 1e999, "b": 1}', b'{"a": ' + b"9" * 5000 + b', "b": 1}'])
def test_nan_infinity_and_huge_numbers_count_zero(raw: bytes) -> None:
    result = reading(None, raw=raw)
    assert result.reward == 0.5 and "key 'a' holds" in result.problem and "not a finite number" in result.problem
    assert result.rewards == {"a": 0.0, "b": 1.0}


def test_ten_thousand_keys_count_but_only_some_are_logged() -> None:
    data = {f"k{i}": float(i % 2) for i in range(10_000)}
    result = reading(data)
    assert result.reward == 0.5 and len(result.rewards) == MAX_KEYS
    assert list(result.rewards) == [f"k{i}" for i in range(MAX_KEYS)]
    assert f"reward.json has 10000 keys: only the first {MAX_KEYS} are logged" in result.problem


def test_the_problem_stays_short() -> None:
    result = reading({f"k{i}": "x" for i in range(500)})
    assert result.reward == 0.0 and result.problem.endswith("and 497 more") and len(result.problem) < 1000


# -- the weights ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("weights", "problem"), [
    ({}, "non-empty table"), ({"a": 0}, "at least one weight above 0"), ({"a": -1}, "a must be a finite number"),
    ({"a": math.inf}, "finite"), ({"a": math.nan}, "finite"), ({"a": True}, "finite number"), ({"a": "1"}, "finite"),
    ([1], "non-empty table"),
])
def test_bad_weights_are_refused(weights: Any, problem: str) -> None:
    assert problem in weights_problem(weights)


def test_weights_from_the_task_and_their_checks(tmp_path: Path) -> None:
    files = {"tests/test.sh": THREE_KEYS_SH}
    good = write_task(tmp_path / "good", files, toml=_toml("reward_weights = {correctness = 0.7, performance = 0.3}"))
    assert load_task(good["task_path"]).reward_weights == WEIGHTS
    bad = [("reward_weights = {a = -1}", "reward_weights a must be a finite number >= 0"),
           ("reward_weights = {a = 0}", "reward_weights needs at least one weight above 0"),
           ('reward_weights = {a = "x"}', "reward_weights a must be a finite number >= 0, got str"),
           ("reward_weights = 1", "reward_weights must be a non-empty table"),
           ("reward_weights = {a = nan}", "reward_weights a must be a finite number >= 0, got float nan")]
    for index, (line, said) in enumerate(bad):
        row = write_task(tmp_path / f"bad-{index}", files, toml=_toml(line))
        with pytest.raises(TaskFormatError, match=re.escape(f"[metadata.skyrl] {said}")):
            load_task(row["task_path"])


def test_weights_from_the_config_are_checked() -> None:
    assert HarborTerminalConfig(reward_weights={"a": 1}).reward_weights == {"a": 1.0}
    with pytest.raises(ValueError, match="env.reward_weights needs at least one weight above 0"):
        HarborTerminalConfig(reward_weights={"a": 0})


# -- a three-key task on real machines -------------------------------------------------------------------------------

THREE_KEYS_SH = """\
#!/bin/bash
c=0; p=0; s=0
[ "$(cat /app/answer 2>/dev/null)" = 42 ] && c=1
[ -f /app/fast ] && p=0.5
[ -f /app/tidy ] && s=1
printf '{"correctness": %s, "performance": %s, "style": %s}\\n' $c $p $s > /logs/verifier/reward.json
"""
SOLVE_SH = "#!/bin/bash\necho 42 > /app/answer\ntouch /app/fast /app/tidy\n"


def _toml(skyrl_line: str) -> str:
    return ('schema_version = "1.1"\n[task]\nname = "test/three-keys"\n[metadata.skyrl]\nbase_packages_only = true\n'
            f"{skyrl_line}\n[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 60.0\n"
            '[environment]\nbuild_timeout_sec = 60.0\nmemory_mb = 512\nworkdir = "/app"\n')


@pytest.fixture(scope="module")
def three_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_task(tmp_path_factory.mktemp("tasks") / "three-keys", {
        "tests/test.sh": THREE_KEYS_SH, "solution/solve.sh": SOLVE_SH,
    }, toml=_toml("reward_weights = {correctness = 0.5, performance = 0.3, style = 0.2}"))


def oracle(row: dict[str, Any], **config: Any) -> tuple[list[Any], HarborTerminalEnv]:
    env = HarborTerminalEnv(task=row, config=config)
    try:
        env.reset()
        return [env.step(action) for action in env.gold_actions()], env
    finally:
        env.close()


def test_the_oracle_scores_the_weighted_value_and_every_key_is_logged(machine_backend: str,
                                                                      three_keys: dict[str, Any]) -> None:
    results, env = oracle(three_keys, backend=machine_backend)
    last = results[-1]
    assert last.terminated and math.isclose(last.reward, 0.85)
    assert last.info["rewards"] == {"correctness": 1.0, "performance": 0.5, "style": 1.0}
    assert last.info["step_rewards_by_key"] == [last.info["rewards"]] and "reward_problem" not in last.info
    metrics = env.get_metrics()
    assert {key: metrics[key] for key in metrics if key.startswith("reward/")} == {
        "reward/correctness": 1.0, "reward/performance": 0.5, "reward/style": 1.0}
    assert metrics["passed"] == 0.0  # 0.85 is not a pass


def test_doing_nothing_scores_zero(machine_backend: str, three_keys: dict[str, Any]) -> None:
    results, env = play(three_keys, ["<done/>"], backend=machine_backend)
    assert results[-1].reward == 0.0
    assert results[-1].info["rewards"] == {"correctness": 0.0, "performance": 0.0, "style": 0.0}
    assert env.get_metrics()["reward/correctness"] == 0.0


def test_the_config_weights_override_the_tasks(docker_backend: str, three_keys: dict[str, Any]) -> None:
    results, _ = oracle(three_keys, backend=docker_backend, reward_weights={"correctness": 1})
    assert results[-1].reward == 1.0


def test_a_reward_file_the_agent_writes_counts_for_nothing(machine_backend: str, three_keys: dict[str, Any]) -> None:
    """Like the reward_written probe, with the high-weight key: /logs/verifier is emptied before the tests."""
    forged = json.dumps({"reward": 1, "correctness": 1, "performance": 1, "style": 1})
    results, _ = play(three_keys, [bash(
        f"echo '{forged}' > /logs/verifier/reward.json; echo 1 > /logs/verifier/reward.txt",
        f"(while :; do echo '{forged}' > /logs/verifier/reward.json 2>/dev/null; sleep 0.05; done) &",
        done=True)], backend=machine_backend)
    assert results[-1].reward == 0.0 and results[-1].info["reward_source"] == "reward.json"
    assert results[-1].info["rewards"] == {"correctness": 0.0, "performance": 0.0, "style": 0.0}


async def test_each_key_reaches_the_sample_records_and_the_rollout_metrics(
        machine_backend: str, three_keys: dict[str, Any], scripted_engine: Any, tmp_path: Path) -> None:
    from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
    from skyrl_core.trajectory import read_jsonl

    engine = scripted_engine(bash("echo 42 > /app/answer; touch /app/fast", done=True))
    generator = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_tokens_per_turn=512,
                                                   max_total_tokens=512, max_context_length=4096),
                                   engine=engine, tokenizer=engine.tokenizer, env_id="harbor_terminal",
                                   env_config={"backend": machine_backend})
    batch = await generator.generate([three_keys])
    batch.to_jsonl(tmp_path / "samples.jsonl")
    (sample,) = read_jsonl(tmp_path / "samples.jsonl")
    assert sample.error is None and math.isclose(sample.reward, 0.65)
    assert sample.turns[-1].info["rewards"] == {"correctness": 1.0, "performance": 0.5, "style": 0.0}
    assert sample.metrics["reward/performance"] == 0.5
    assert batch.metrics["env/reward/correctness"] == 1.0 and batch.metrics["env/reward/style"] == 0.0


MULTI_TOML = """\
schema_version = "1.1"
multi_step_reward_strategy = "{strategy}"
[task]
name = "test/keys-by-step"
[metadata.skyrl]
base_packages_only = true
[verifier]
timeout_sec = 20.0
[environment]
workdir = "/app"
[[steps]]
name = "one"
[[steps]]
name = "two"
"""


@pytest.mark.parametrize(("strategy", "episode"), [("mean", {"a": 0.75, "b": 0.0, "c": 0.25}),
                                                   ("final", {"a": 0.5, "b": 0.0, "c": 0.5})])
def test_each_key_is_combined_over_the_steps_as_the_rewards_are(docker_backend: str, tmp_path: Path, strategy: str,
                                                                 episode: dict[str, float]) -> None:
    row = write_task(tmp_path / "keys", {
        "steps/one/instruction.md": "One.\n", "steps/two/instruction.md": "Two.\n",
        "steps/one/tests/test.sh": "#!/bin/bash\necho '{\"a\": 1, \"b\": 0}' > /logs/verifier/reward.json\n",
        "steps/two/tests/test.sh": "#!/bin/bash\necho '{\"a\": 0.5, \"c\": 0.5}' > /logs/verifier/reward.json\n",
    }, toml=MULTI_TOML.format(strategy=strategy))
    results, env = play(row, ["<done/>", "<done/>"], backend=docker_backend)
    first, last = results
    assert first.info["step_reward"] == 0.5 and first.info["step_reward_by_key"] == {"a": 1.0, "b": 0.0}
    assert last.info["step_rewards_by_key"] == [{"a": 1.0, "b": 0.0}, {"a": 0.5, "c": 0.5}]
    assert last.info["rewards"] == episode  # a step without the key counts 0, as a step not reached does
    assert last.reward == 0.5
    assert {k: v for k, v in env.get_metrics().items() if k.startswith("reward/")} == {
        f"reward/{key}": value for key, value in episode.items()}
