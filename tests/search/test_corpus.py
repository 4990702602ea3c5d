"""Corpus files: wiki-18 JSONL, explicit title/text rows, Parquet, round trips, and the errors users see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skyrl_search.corpus import PassageStore, read_corpus, write_corpus_jsonl
from skyrl_search.retrieval import Passage


def write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_wiki18_rows_split_the_quoted_title_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "c.jsonl", [
        {"id": "0", "contents": '"Aaron"\nAaron is a prophet, high priest, and the brother of Moses.'},
        {"id": 7, "contents": "A passage without a title line.\nIts second line."},
        "",
        {"id": "2", "title": "Explicit", "text": "Rows may carry title and text fields."},
        {"contents": '"Ümlaut"\nnon-ASCII text: 東京'},
    ])
    passages = list(read_corpus(path))
    assert passages == [
        Passage("0", "Aaron", "Aaron is a prophet, high priest, and the brother of Moses."),
        Passage("7", "", "A passage without a title line.\nIts second line."),
        Passage("2", "Explicit", "Rows may carry title and text fields."),
        Passage("4", "Ümlaut", "non-ASCII text: 東京"),  # no id: its 0-based line number
    ]


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "line 2: not valid JSON"),
    ('["a", "list"]', "line 2: expected a JSON object"),
    ('{"id": "1", "body": "no contents"}', "line 2: a row needs a string 'contents'"),
    ('{"id": [1], "contents": "x"}', "line 2: 'id' must be a string or an integer"),
])
def test_a_bad_jsonl_row_is_named_by_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [{"id": "0", "contents": '"T"\nfine'}, line])
    with pytest.raises(ValueError, match=message) as error:
        list(read_corpus(path))
    assert str(path) in str(error.value)


def test_a_missing_corpus_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(read_corpus(tmp_path / "nope.jsonl"))


def test_parquet_corpus_reads_both_layouts_and_names_bad_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "contents": ['"Alpha"\nfirst text', "untitled text"]}), good)
    assert list(read_corpus(good)) == [Passage("a", "Alpha", "first text"), Passage("b", "", "untitled text")]
    fields = tmp_path / "fields.parquet"
    pq.write_table(pa.table({"id": ["x"], "title": ["T"], "text": ["body"]}), fields)
    assert list(read_corpus(fields)) == [Passage("x", "T", "body")]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "contents": ["ok", None]}), bad)
    with pytest.raises(ValueError, match=r"bad\.parquet, row 1: a row needs a string 'contents'"):
        list(read_corpus(bad))


def test_written_jsonl_reads_back_identically(tmp_path: Path) -> None:
    passages = [Passage("1", "Title", "text with \"quotes\" and\nnewlines"), Passage("2", "", "no title"),
                Passage("3", "Two\nline title", "kept exactly"), Passage("4", "Unicode ✓", "ß")]
    path = tmp_path / "out.jsonl"
    assert write_corpus_jsonl(passages, path) == 4
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[0]) == {
        "id": "1", "contents": '"Title"\ntext with "quotes" and\nnewlines'}
    assert list(read_corpus(path)) == passages


def test_passage_store_reads_any_passage_by_position(tmp_path: Path) -> None:
    passages = [Passage(str(i), f"T{i}", f"text {i} " + "é" * i) for i in range(50)]
    assert PassageStore.write(iter(passages), tmp_path) == 50
    store = PassageStore(tmp_path)
    assert len(store) == 50
    assert [store[i] for i in (49, 0, 17)] == [passages[49], passages[0], passages[17]]
