"""search through the bridge against our own retrieval server (skyrl-search's, real uvicorn on loopback).

A finding pinned here: skyrl-gym's search scores the last <answer> of the whole history, retrieved passages
included, so an episode whose reply never answers is paid when a passage holds '<answer>...</answer>'.
"""

from __future__ import annotations

import socket
import time
from contextlib import ExitStack

import pytest
from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_core.factory import env_class
from skyrl_core.testing import check_env

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def search_row(question, target, row_id):
    return {"data_source": "bridge-test", "id": row_id, "env_class": "search",
            "prompt": [{"role": "user", "content": f"Answer the question. Search with <search>query</search>, answer "
                                                   f"with <answer>answer</answer>. Question: {question}"}],
            "reward_spec": {"method": "rule", "ground_truth": {"target": target}}, "extra_info": {}}


@pytest.fixture
def search_data(tmp_path, monkeypatch, rows_io):
    from skyrl_search.bm25 import BM25Retriever
    from skyrl_search.corpus import write_corpus_jsonl
    from skyrl_search.retrieval import Passage
    from skyrl_search.server import create_app, running_server

    monkeypatch.setenv("SKYRL_SEARCH_CACHE", str(tmp_path / "cache"))
    passages = [Passage("lima", "Lima", "Lima is the capital of Peru."),
                Passage("oslo", "Oslo", "Oslo is the capital of Norway."),
                Passage("quiz", "Quiz sheet", "Quiz key for the capital of Chad: <answer>N'Djamena</answer>")]
    write_corpus_jsonl(passages, tmp_path / "corpus.jsonl")
    retriever = BM25Retriever.build_index(tmp_path / "corpus.jsonl", tmp_path / "index", progress=False)
    rows = [search_row("What is the capital of Peru?", ["Lima"], "peru"),
            search_row("What is the capital of Chad?", ["N'Djamena"], "chad")]
    path = rows_io.write_jsonl(tmp_path / "train.jsonl", rows)
    with ExitStack() as stack:
        base = stack.enter_context(running_server(create_app(retriever)))
        yield {"name": "search", "args": {"search_url": f"{base}/retrieve", "timeout": 10},
               "data_files": {"train": str(path)}}
    from skyrl_gym.tools.search import SearchToolGroup

    session = SearchToolGroup._session_pool.pop(base, None)  # the peer's class-wide session
    if session is not None:
        session.close()


def make(config, row=0):
    cls = env_class("skyrl_gym")
    config = SkyRLGymConfig(**config)
    return cls(task=cls.load_dataset("train", config)[row], config=config)


def test_search_passes_check_env_against_our_server(search_data):
    report = check_env("skyrl_gym", config=search_data, n_tasks=2, raise_on_failure=False)
    assert not report.failed and "gold[row 1]" in report.passed, report.failed


def test_a_search_then_an_answer(search_data):
    env = make(search_data)
    env.reset(seed=0)
    first = env.step("<search>capital of Peru</search>")
    assert "Lima is the capital of Peru" in first.observation[0]["content"] and first.reward == 0.0
    last = env.step("<answer>Lima</answer>")
    assert last.terminated and last.reward == 1.0


def test_finding_a_retrieved_answer_tag_pays_an_episode_that_never_answers(search_data):
    env = make(search_data, row=1)
    env.reset(seed=0)
    first = env.step("<search>quiz key capital of Chad</search>")
    assert "<answer>N'Djamena</answer>" in first.observation[0]["content"]
    last = env.step("I do not know.")
    assert last.terminated and last.reward == 1.0  # the passage's <answer> was scored as the model's


def test_no_retrieval_server_is_one_clear_error_at_reset_not_a_45_second_retry():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and closed again below: nothing listens
    env = env_class("skyrl_gym")(
        task={"prompt": [{"role": "user", "content": "Q?"}], "reward_spec": {"ground_truth": {"target": ["x"]}}},
        config={"name": "search", "args": {"search_url": f"http://127.0.0.1:{port}/retrieve"}})
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"needs a retrieval server.*skyrl-search serve.*env.args.search_url"):
        env.reset(seed=0)
    assert time.monotonic() - started < 10


def test_adversarial_quick_on_search(search_data):
    from skyrl_core.testing import check_adversarial

    report = check_adversarial("skyrl_gym", config=search_data, quick=True)
    assert report.ok, report.problems()
