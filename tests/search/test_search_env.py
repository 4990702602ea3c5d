"""The ``search`` env: turns, observations, reward integrity, metrics, datasets and the eval table."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from skyrl_core import GeneratorConfig, MultiTurnGenerator
from skyrl_core.data import DataError
from skyrl_core.testing import check_env
from skyrl_search.data import ONE_HOP, TWO_HOP, builtin_passages, builtin_questions
from skyrl_search.env import SearchEnv, shared_retriever
from skyrl_search.evaluate import em_table, main
from skyrl_search.retrieval import Passage, RetrievalError, register_retriever

QUIET = {"retriever_options": {"progress": False}}


class FailingRetriever:
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        raise RetrievalError("retrieval server at http://127.0.0.1:9/retrieve refused the connection")


class EmptyRetriever:
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[] for _ in queries]


class PlantingRetriever:
    """A corpus whose passage holds an answer tag with the gold answer of the test's question."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.planted = options["planted"]

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[Passage("x", "Planted", f"<answer> {self.planted} </answer>")] for _ in queries]


made: list[Mapping[str, Any]] = []


def _counted(options: Mapping[str, Any]) -> EmptyRetriever:
    made.append(options)
    return EmptyRetriever()


register_retriever("test_env_failing", lambda options: FailingRetriever())
register_retriever("test_env_empty", lambda options: EmptyRetriever())
register_retriever("test_env_planting", PlantingRetriever)
register_retriever("test_env_counted", _counted)


def start(task: Mapping[str, Any], **config: Any) -> SearchEnv:
    env = SearchEnv(task, {**QUIET, **config})
    env.reset(seed=0)
    return env


def play(env: SearchEnv, actions: Sequence[str]) -> list[tuple[list[dict[str, str]], float, bool, bool]]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, reward, terminated, truncated))
    return out


@pytest.fixture(scope="module")
def test_rows() -> list[dict[str, Any]]:
    return builtin_questions("test")


@pytest.fixture(scope="module")
def one_hop(test_rows) -> dict[str, Any]:
    return next(q for q in test_rows if q["data_source"] == ONE_HOP)


@pytest.fixture(scope="module")
def two_hop(test_rows) -> dict[str, Any]:
    return next(q for q in test_rows if q["data_source"] == TWO_HOP)


def test_check_env_passes():
    report = check_env("search", n_tasks=4)
    assert not report.failed and {"gold[row 1]", "gold[row 4]", "astep", "determinism"} <= set(report.passed)


def test_prompt_states_the_format_and_the_question(one_hop):
    prompt, info = SearchEnv(one_hop, QUIET).reset()
    assert [m["role"] for m in prompt] == ["system", "user"] and info["max_turns"] == 4
    user = prompt[1]["content"]
    assert user.endswith(f"Question: {one_hop['question']}")
    assert all(tag in user for tag in ("<search>", "</search>", "<information>", "<answer>", "</answer>"))


def test_gold_actions_score_one_on_the_first_20_test_questions(test_rows):
    for row in test_rows[:20]:
        env = start(row)
        steps = play(env, env.gold_actions())
        assert [s[1] for s in steps] == [0.0] * len(row["gold_queries"]) + [1.0], row
        assert steps[-1][2] and not steps[-1][3]
        metrics = env.get_metrics()
        assert metrics["searches"] == len(row["gold_queries"]) and metrics["em"] == metrics["answered"] == 1.0
        assert metrics["retrieval_latency_s"] > 0 and metrics["invalid_turns"] == 0


def test_astep_plays_the_same_episode(two_hop):
    env = start(two_hop)

    async def episode() -> list[Any]:
        return [await env.astep(a) for a in env.gold_actions()]

    steps = asyncio.run(episode())
    assert [s.reward for s in steps] == [0.0, 0.0, 1.0] and steps[-1].terminated
    assert steps[0].observation == start(two_hop).step(env.gold_actions()[0]).observation


def test_answering_without_searching_scores_near_zero(test_rows):
    """Guessing the most common train answer, or a name from the question, almost never matches."""
    common = Counter(a for q in builtin_questions("train") for a in q["answers"]).most_common(1)[0][0]
    guess_rewards, name_rewards = [], []
    for row in test_rows:
        guess_rewards.append(start(row).step(f"<answer> {common} </answer>").reward)
        words = [w.strip("?,") for w in row["question"].split()[1:] if w[:1].isupper()]
        names = words + [" ".join(pair) for pair in zip(words, words[1:], strict=False)]
        name_rewards.append(max(start(row).step(f"<answer> {name} </answer>").reward for name in names))
    assert sum(guess_rewards) / len(test_rows) < 0.05
    assert sum(name_rewards) / len(test_rows) < 0.05


def test_search_results_are_readable_text(one_hop):
    env = start(one_hop)
    obs, reward, terminated, truncated, info = env.step(f"<think>Look it up.</think><search>{one_hop['gold_queries'][0]}"
                                                        "</search>")
    assert (reward, terminated, truncated, info["query_status"]) == (0.0, False, False, "ok")
    assert len(obs) == 1 and obs[0]["role"] == "user"
    text = obs[0]["content"]
    assert text.startswith("<information>Doc 1 (Title: ") and text.endswith("</information>")
    lines = text.removeprefix("<information>").removesuffix("</information>").split("\n")
    assert [line.split(" (Title:")[0] for line in lines] == ["Doc 1", "Doc 2", "Doc 3"]
    title = {p["id"]: p["title"] for p in builtin_passages()}[one_hop["gold_passage_ids"][0]]
    assert f"(Title: {title}) " in text and one_hop["answers"][0] in text
    assert "\\n" not in text and '\\"' not in text and '{"' not in text


def test_passages_are_cut_to_max_passage_chars(one_hop):
    obs, *_ = start(one_hop, max_passage_chars=50).step(f"<search>{one_hop['gold_queries'][0]}</search>")
    for line in obs[0]["content"].removeprefix("<information>").removesuffix("</information>").split("\n"):
        text = line.split(") ", 1)[1]
        assert len(text) <= 50 + len(" ...") and text.endswith(" ...")


@pytest.mark.parametrize(("action", "expected", "counter"), [
    ("<search>   </search>", "Your search query was empty", "empty_queries"),
    ("<search>" + "kelmar " * 60 + "</search>", "Your search query was 419 characters; the limit is 300. It was not "
                                                "run.", "long_queries"),
    ("I believe it is Kelmar.", "neither a search nor an answer", "invalid_turns"),
    ("<search> never closed", "neither a search nor an answer", "invalid_turns"),
    ("<answer> never closed", "neither a search nor an answer", "invalid_turns"),
    ("", "Your response was empty", "invalid_turns"),
])
def test_bad_turns_are_told_what_was_wrong_and_the_episode_goes_on(one_hop, action, expected, counter):
    env = start(one_hop)
    obs, reward, terminated, truncated, _ = env.step(action)
    assert expected in obs[0]["content"] and obs[0]["role"] == "user"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.get_metrics()[counter] == 1.0 and env.get_metrics()["searches"] == 0.0
    assert [s[1] for s in play(env, env.gold_actions())] == [0.0, 1.0]


def test_the_query_limit_is_a_config_value(one_hop):
    obs, *_ = start(one_hop, max_query_chars=10).step(f"<search>{one_hop['gold_queries'][0]}</search>")
    assert "the limit is 10" in obs[0]["content"]


def test_a_failed_search_is_shown_and_the_episode_goes_on(one_hop):
    env = start(one_hop, retriever="test_env_failing")
    obs, reward, terminated, truncated, info = env.step("<search> anything </search>")
    assert obs[0]["content"] == ("<information>Search failed: retrieval server at http://127.0.0.1:9/retrieve "
                                 "refused the connection</information>")
    assert (reward, terminated, truncated, info["query_status"]) == (0.0, False, False, "error")
    assert env.step(f"<answer>{one_hop['answers'][0]}</answer>").reward == 1.0
    assert env.get_metrics()["retrieval_errors"] == 1.0 and env.get_metrics()["searches"] == 1.0


def test_a_search_with_no_results_says_so(one_hop):
    obs, *_ = start(one_hop, retriever="test_env_empty").step("<search> zzz </search>")
    assert obs[0]["content"] == "<information>No results found.</information>"


def test_reward_comes_only_on_the_last_turn(two_hop):
    env = start(two_hop)
    rewards = [s[1] for s in play(env, env.gold_actions())]
    assert rewards == [0.0, 0.0, 1.0]


def test_the_last_turn_ends_the_episode_without_searching(one_hop):
    env = start(one_hop, max_turns=2)
    first = env.step("<search> kelmar </search>")
    assert not (first.terminated or first.truncated)
    obs, reward, terminated, truncated, info = env.step(f"<search>{one_hop['gold_queries'][0]}</search>")
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert "turn limit" in info["truncated_reason"]
    assert env.get_metrics()["searches"] == 1.0 and env.get_metrics()["answered"] == 0.0


def test_an_answer_tag_inside_an_observation_is_not_the_models_answer(one_hop):
    gold = one_hop["answers"][0]
    env = start(one_hop, retriever="test_env_planting", retriever_options={"planted": gold}, max_turns=2)
    obs, *_ = env.step("<search> anything </search>")
    assert f"&lt;answer> {gold} &lt;/answer>" in obs[0]["content"]  # shown, but never as a tag of the episode
    last = env.step("I have no idea.")
    assert last.reward == 0.0 and last.truncated
    assert env.get_metrics()["answered"] == 0.0 and env.get_metrics()["em"] == 0.0


def test_the_last_answer_in_a_reply_counts_and_answering_beats_searching(one_hop):
    gold = one_hop["answers"][0]
    assert start(one_hop).step(f"<answer>Vorn</answer> no, <answer>{gold}</answer>").reward == 1.0
    assert start(one_hop).step(f"<answer>{gold}</answer> no, <answer>Vorn</answer>").reward == 0.0
    env = start(one_hop)
    result = env.step(f"<search> more </search><answer>{gold}</answer>")
    assert result.terminated and result.reward == 1.0 and env.get_metrics()["searches"] == 0.0


def test_the_reward_metric_is_configurable_and_all_are_reported(two_hop):
    gold = two_hop["answers"][0]
    env = start(two_hop, reward="f1")
    result = env.step(f"<answer>{gold} maybe</answer>")
    words = len(gold.split())  # precision words / (words + 1), recall 1
    assert result.reward == pytest.approx(2 * words / (2 * words + 1))
    metrics = env.get_metrics()
    assert metrics["em"] == 0.0 and metrics["subem"] == 1.0 and metrics["f1"] == result.reward
    assert start(two_hop, reward="subem").step(f"<answer>{gold} maybe</answer>").reward == 1.0


def test_one_retriever_per_process_for_the_same_options(one_hop):
    options = {"tag": "shared-test"}
    for _ in range(3):
        start(one_hop, retriever="test_env_counted", retriever_options=options).step("<search> a </search>")
    start(one_hop, retriever="test_env_counted", retriever_options={"tag": "other"}).step("<search> a </search>")
    assert made == [options, {"tag": "other"}]
    assert shared_retriever("test_env_counted", options) is shared_retriever("test_env_counted", dict(options))


def test_an_unknown_retriever_fails_the_episode_loudly(one_hop):
    result = start(one_hop, retriever="no_such_retriever").step("<search> a </search>")
    assert result.truncated and "unknown retriever 'no_such_retriever'" in result.info["error"]


def test_a_row_without_a_question_is_refused():
    with pytest.raises(ValueError, match="search task q7 has no 'question'"):
        SearchEnv({"id": "q7", "answers": ["x"]}).reset()


def test_load_dataset_reads_configured_files(tmp_path: Path):
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps({"question": "Who?", "answers": ["X"]}) + "\n", encoding="utf-8")
    config = SearchEnv.config_class(data_files={"dev": str(path)})
    assert SearchEnv.load_dataset("dev", config)[0]["answers"] == ["X"]
    with pytest.raises(DataError, match="no split 'test'; it has: dev"):
        SearchEnv.load_dataset("test", config)
    assert len(SearchEnv.load_dataset("test", SearchEnv.config_class())) == 300


# -- the eval table from real rollouts ------------------------------------------------------------

def test_eval_table_from_a_rollout_file(tmp_path: Path, test_rows, capsys):
    """The real generator plays 10 questions of each kind: one-hop solved, two-hop answered wrongly."""
    pytest.importorskip("transformers")  # the test tokenizer (skyrl-core[test])
    from skyrl_core.testing.scripted_engine import ScriptedEngine
    from skyrl_core.testing.tokenizers import make_tokenizer

    tokenizer = make_tokenizer("chatml")
    rows = [q for q in test_rows if q["data_source"] == ONE_HOP][:10] + \
           [q for q in test_rows if q["data_source"] == TWO_HOP][:10]

    def reply(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        row = next(r for r in rows if r["question"] in prompt)
        if "<information>Doc" not in prompt:
            return f"<search> {row['gold_queries'][0]} </search>"
        return f"<answer> {row['answers'][0] if row['data_source'] == ONE_HOP else 'Vorn'} </answer>"

    generator = MultiTurnGenerator(GeneratorConfig(temperature=0.0, max_tokens_per_turn=200), engine=ScriptedEngine(
        tokenizer, default=reply), tokenizer=tokenizer, env_id="search", env_config=QUIET)
    batch = asyncio.run(generator.generate(rows, n_samples=1))
    out = tmp_path / "rollouts.jsonl"
    batch.to_jsonl(out)

    table = em_table(out)
    assert [(r.data_source, r.episodes, r.em, r.answered, r.searches) for r in table.rows] == [
        (ONE_HOP, 10, 1.0, 1.0, 1.0), (TWO_HOP, 10, 0.0, 1.0, 1.0)]
    assert (table.average.episodes, table.average.em) == (20, 0.5)
    assert main([str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["data", "source", "episodes", "EM", "F1", "answer", "rate", "searches"]
    assert printed[-1].split()[:3] == ["Average", "20", "0.500"]
    assert main([str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["average"]["em"] == 0.5


def test_eval_refuses_files_that_are_not_search_rollouts(tmp_path: Path, capsys):
    out = tmp_path / "other.jsonl"
    out.write_text(json.dumps({"reward": 1.0, "task": {"data_source": "x"}, "metrics": {"em": 1.0}}) + "\n",
                   encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main([str(out)])
    assert exit_info.value.code == 2
    assert "other.jsonl record 1: no f1, answered, searches metric(s)" in capsys.readouterr().err
