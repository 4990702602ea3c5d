"""The built-in synthetic corpus and questions, and the Search-R1 / JSONL question loaders."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from skyrl_core.data import DataError
from skyrl_search.corpus import read_corpus
from skyrl_search.data import (
    ONE_HOP,
    TWO_HOP,
    builtin_corpus_path,
    builtin_passages,
    builtin_questions,
    generate_world,
    load_questions,
)
from skyrl_search.retrieval import make_retriever


def test_generation_is_deterministic():
    first, second = generate_world(), generate_world()
    assert first.passages == second.passages
    assert first.questions == second.questions


def test_corpus_file_is_wiki18_jsonl_written_once(tmp_path: Path):
    path = builtin_corpus_path(tmp_path / "a")
    assert path == tmp_path / "a" / "builtin-v1" / "corpus.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(builtin_passages()) >= 2500
    first = json.loads(lines[0])
    assert set(first) == {"id", "contents"}
    title, text = first["contents"].split("\n", 1)
    assert title.startswith('"') and title.endswith('"') and text
    assert len({json.loads(line)["id"] for line in lines}) == len(lines)
    # identical bytes in another cache, and not rewritten when present; no temporary files left behind
    assert builtin_corpus_path(tmp_path / "b").read_bytes() == path.read_bytes()
    before = path.stat().st_mtime_ns
    assert builtin_corpus_path(tmp_path / "a") == path and path.stat().st_mtime_ns == before
    assert [p.name for p in path.parent.iterdir()] == ["corpus.jsonl"]
    # the corpus reader of the bm25 index reads it back as titled passages
    passages = list(read_corpus(path))
    assert (passages[0].id, passages[0].title, passages[0].text) == (first["id"], title.strip('"'), text)


def test_corpus_location_follows_the_cache_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SKYRL_SEARCH_CACHE", str(tmp_path))
    assert builtin_corpus_path() == tmp_path / "builtin-v1" / "corpus.jsonl"


def test_splits_have_their_sizes_and_both_question_kinds():
    train, test = builtin_questions("train"), builtin_questions("test")
    assert len(train) == 2000 and len(test) == 300
    assert Counter(q["data_source"] for q in test) == {ONE_HOP: 150, TWO_HOP: 150}
    assert {q["data_source"] for q in train} == {ONE_HOP, TWO_HOP}
    for q in train + test:
        assert set(q) == {"id", "question", "answers", "data_source", "gold_queries", "gold_passage_ids"}
        assert len(q["gold_queries"]) == len(q["gold_passage_ids"]) == (1 if q["data_source"] == ONE_HOP else 2)
    with pytest.raises(ValueError, match="no split 'dev'.*train, test"):
        builtin_questions("dev")


def test_splits_are_disjoint_down_to_the_passages_they_need():
    train, test = builtin_questions("train"), builtin_questions("test")
    assert not {q["id"] for q in train} & {q["id"] for q in test}
    assert not {q["question"] for q in train} & {q["question"] for q in test}
    train_passages = {p for q in train for p in q["gold_passage_ids"]}
    assert not train_passages & {p for q in test for p in q["gold_passage_ids"]}


def test_answers_never_appear_in_the_question():
    for q in builtin_questions("train") + builtin_questions("test"):
        assert not any(a.lower() in q["question"].lower() for a in q["answers"]), q


def test_every_gold_query_retrieves_its_passage_in_bm25_top_3():
    retriever = make_retriever("bm25", {"progress": False})
    hops = [(query, passage) for split in ("train", "test") for q in builtin_questions(split)
            for query, passage in zip(q["gold_queries"], q["gold_passage_ids"], strict=True)]
    results = retriever.retrieve([query for query, _ in hops], 3)
    missed = [(query, passage) for (query, passage), found in zip(hops, results, strict=True)
              if passage not in [p.id for p in found]]
    assert len(hops) > 2300 and not missed


def test_the_answer_is_in_the_last_gold_passage():
    text = {p["id"]: p["text"] for p in builtin_passages()}
    for q in builtin_questions("test"):
        assert q["answers"][0] in text[q["gold_passage_ids"][-1]], q


# -- question files -------------------------------------------------------------------------------

def _search_r1_row(question: str, target: object, source: str = "nq") -> dict[str, object]:
    instruction = ("Answer the given question. Reason first, then <search> query </search> if needed, "
                   "and answer in <answer></answer>.")
    return {"data_source": source, "ability": "fact-reasoning",
            "prompt": [{"role": "system", "content": "You are a helpful and harmless assistant."},
                       {"role": "user", "content": f"{instruction} Question: {question}\n"}],
            "reward_spec": {"ground_truth": {"target": target}, "method": "rule"}}


def test_search_r1_parquet_rows(tmp_path: Path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    rows = [_search_r1_row("who wrote the iliad?", ["Homer"], "searchR1_nq"),
            _search_r1_row("capital of france", ["Paris", "paris, france"], "searchR1_hotpotqa")]
    path = tmp_path / "validation.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    loaded = load_questions(path)
    assert loaded == [
        {"id": "validation-1", "question": "who wrote the iliad?", "answers": ["Homer"], "data_source": "searchR1_nq"},
        {"id": "validation-2", "question": "capital of france", "answers": ["Paris", "paris, france"],
         "data_source": "searchR1_hotpotqa"}]
    json.dumps(loaded)  # rows travel to workers and into trajectory files


def test_a_string_target_becomes_a_one_answer_list(tmp_path: Path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(_search_r1_row("how tall is it?", "828 m")) + "\n", encoding="utf-8")
    assert load_questions(path)[0]["answers"] == ["828 m"]


def test_jsonl_rows_with_answers_or_golden_answers(tmp_path: Path):
    path = tmp_path / "qa.jsonl"
    rows = [{"id": "a", "question": "Who?", "answers": ["X"], "gold_queries": ["who x"]},
            {"question": " Where? ", "golden_answers": ["Y", "Z"], "data_source": "popqa"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    assert load_questions(path) == [
        {"id": "a", "question": "Who?", "answers": ["X"], "data_source": "qa", "gold_queries": ["who x"]},
        {"id": "qa-2", "question": "Where?", "answers": ["Y", "Z"], "data_source": "popqa"}]


@pytest.mark.parametrize(("row", "problem"), [
    ({"answers": ["X"]}, "row 2: no question"),
    ({"question": "Who?"}, "row 2: no answers"),
    ({"question": "Who?", "answers": []}, "row 2: no answers"),
    ({"question": "Who?", "answers": ["X"], "gold_queries": "who"}, "row 2: 'gold_queries' must be a list"),
])
def test_bad_rows_name_the_file_and_row(tmp_path: Path, row: dict[str, object], problem: str):
    path = tmp_path / "bad.jsonl"
    good = {"question": "fine?", "answers": ["yes"]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"bad.jsonl {problem}"):
        load_questions(path)


def test_missing_or_unknown_files_are_refused(tmp_path: Path):
    with pytest.raises(DataError, match="does not exist"):
        load_questions(tmp_path / "nope.jsonl")
    csv = tmp_path / "q.csv"
    csv.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q.csv: expected a .parquet or .jsonl file"):
        load_questions(csv)
