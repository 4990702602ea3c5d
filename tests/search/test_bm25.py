"""BM25 retrieval on bm25s: relevance, batching, limits, index folders built once and shared, mmap loads."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
from skyrl_search import bm25
from skyrl_search.bm25 import BM25Retriever
from skyrl_search.corpus import write_corpus_jsonl
from skyrl_search.data import builtin_questions
from skyrl_search.retrieval import Passage, make_retriever

PASSAGES = [
    Passage("p0", "Mount Vesuvius", "Mount Vesuvius is a somma-stratovolcano near Naples whose eruption in 79 AD "
                                    "buried Pompeii and Herculaneum under ash."),
    Passage("p1", "Marie Curie", "Marie Curie was a physicist and chemist who conducted pioneering research on "
                                 "radioactivity and won two Nobel Prizes."),
    Passage("p2", "Amazon River", "The Amazon River in South America is the largest river by discharge volume of "
                                  "water in the world."),
    Passage("p3", "Great Barrier Reef", "The Great Barrier Reef off Queensland, Australia, is the world's largest "
                                        "coral reef system, made of thousands of individual reefs."),
    Passage("p4", "Johann Sebastian Bach", "Johann Sebastian Bach was a German composer of the Baroque period, known "
                                           "for the Brandenburg Concertos and the Mass in B minor."),
    Passage("p5", "Mount Everest", "Mount Everest, in the Himalayas on the border of Nepal and China, is Earth's "
                                   "highest mountain above sea level."),
    Passage("p6", "Python (programming language)", "Python is a high-level programming language created by Guido "
                                                   "van Rossum and first released in 1991."),
    Passage("p7", "Naples", "Naples is the regional capital of Campania in southern Italy, on the Gulf of Naples "
                            "near Vesuvius."),
    Passage("p8", "Penicillin", "Penicillin, discovered by Alexander Fleming in 1928, was one of the first "
                                "antibiotics used against bacterial infections."),
    Passage("p9", "Sahara", "The Sahara is the largest hot desert in the world, covering much of North Africa."),
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    write_corpus_jsonl(PASSAGES, path)
    return path


@pytest.fixture
def index(corpus: Path, tmp_path: Path) -> BM25Retriever:
    return BM25Retriever.build_index(corpus, tmp_path / "index", progress=False)


def ids(results: list[list[Passage]]) -> list[list[str]]:
    return [[p.id for p in hits] for hits in results]


def test_distinctive_words_rank_their_passage_first_in_batch_order(index: BM25Retriever) -> None:
    queries = ["who discovered penicillin antibiotics", "Brandenburg Concertos composer",
               "eruption that buried Pompeii", "coral reef Queensland", "Guido van Rossum language"]
    results = index.retrieve(queries, topk=3)
    assert [hits[0].id for hits in results] == ["p8", "p4", "p0", "p3", "p6"]
    for hits in results:
        scores = [p.score for p in hits]
        assert all(type(s) is float for s in scores) and scores == sorted(scores, reverse=True)
    assert results[2][0] == Passage("p0", "Mount Vesuvius", PASSAGES[0].text, results[2][0].score)


def test_titles_are_searchable_and_shared_words_rank_by_relevance(index: BM25Retriever) -> None:
    [hits] = index.retrieve(["Naples Vesuvius"], topk=3)
    assert {p.id for p in hits[:2]} == {"p0", "p7"}
    [hits] = index.retrieve(["Sahara"], topk=3)
    assert ids([hits]) == [["p9"]]  # only passages sharing a word with the query come back


def test_topk_larger_than_the_corpus_is_capped(index: BM25Retriever) -> None:
    [hits] = index.retrieve(["largest world"], topk=50)
    assert {p.id for p in hits} == {"p2", "p3", "p9"}
    [hits] = index.retrieve(["mount naples largest world radioactivity python penicillin bach sahara"], topk=50)
    assert sorted(p.id for p in hits) == sorted(p.id for p in PASSAGES)  # a word of each: all ten, no error
    with pytest.raises(ValueError, match="topk must be at least 1"):
        index.retrieve(["x"], topk=0)
    with pytest.raises(TypeError, match="a list of queries, got one string"):
        index.retrieve("Sahara", topk=1)


def test_empty_stopword_and_unknown_queries_get_no_passages(index: BM25Retriever) -> None:
    results = index.retrieve(["", "   ", "the of and", "zzyzx qwertyuiop", "Everest"], topk=3)
    assert ids(results) == [[], [], [], [], ["p5"]]
    assert index.retrieve([], topk=3) == []


def test_saved_index_loads_with_identical_results_memory_mapped_or_not(index: BM25Retriever) -> None:
    queries = ["largest river discharge", "Nobel Prizes radioactivity", "Himalayas Nepal", "programming 1991"]
    expected = index.retrieve(queries, topk=4)
    for mmap in (True, False):
        loaded = BM25Retriever.load(index.index_dir, mmap=mmap)
        assert loaded.retrieve(queries, topk=4) == expected
        assert isinstance(loaded._model.scores["data"], np.memmap) is mmap
    assert len(loaded) == len(PASSAGES)


def test_a_pickled_retriever_reloads_from_its_folder(index: BM25Retriever) -> None:
    copy = pickle.loads(pickle.dumps(index))
    assert len(pickle.dumps(index)) < 1000  # the folder travels, not the index
    assert copy.retrieve(["Fleming antibiotics"], topk=2) == index.retrieve(["Fleming antibiotics"], topk=2)


def test_manifest_describes_the_index(index: BM25Retriever, corpus: Path) -> None:
    m = index.manifest
    assert m["format"] == "skyrl-search-bm25" and m["format_version"] == bm25.FORMAT.version
    assert m["corpus"] == str(corpus.resolve()) and m["corpus_bytes"] == corpus.stat().st_size
    assert m["passages"] == len(PASSAGES) and m["bm25s_version"] and m["stopwords"] == "en"
    assert (index.index_dir / "manifest.json").is_file()


def test_options_build_once_then_reuse_and_rebuild_when_the_corpus_changes(corpus: Path, tmp_path: Path) -> None:
    options = {"corpus": str(corpus), "index_dir": str(tmp_path / "idx"), "progress": False}
    first = make_retriever("bm25", options)
    manifest = tmp_path / "idx" / "manifest.json"
    built_at = manifest.stat().st_mtime_ns
    again = make_retriever("bm25", options)
    assert again is first and manifest.stat().st_mtime_ns == built_at  # shared, not rebuilt
    assert make_retriever("bm25", {"index_dir": str(tmp_path / "idx")}) is first

    write_corpus_jsonl([*PASSAGES, Passage("p10", "Kilimanjaro", "Kilimanjaro is a dormant volcano in Tanzania.")],
                       corpus)
    rebuilt = make_retriever("bm25", options)
    assert rebuilt is not first and len(rebuilt) == 11
    assert ids(rebuilt.retrieve(["Tanzania"], topk=2)) == [["p10"]]


def test_concurrent_builders_build_the_index_once(corpus: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[Path] = []
    real_build = bm25._build

    def counting_build(*args: object, **kwargs: object) -> dict[str, object]:
        builds.append(args[1])
        return real_build(*args, **kwargs)

    monkeypatch.setattr(bm25, "_build", counting_build)
    options = {"corpus": str(corpus), "index_dir": str(tmp_path / "shared"), "progress": False}
    got: list[BM25Retriever] = []
    threads = [threading.Thread(target=lambda: got.append(BM25Retriever.from_options(options))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(got) == 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".shared.")) == [".shared.lock"]


def test_index_dir_without_an_index_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'empty'} holds no BM25 index"):
        make_retriever("bm25", {"index_dir": str(tmp_path / "empty")})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="busy is not empty and holds no index"):
        make_retriever("bm25", {"index_dir": str(tmp_path / "busy"), "corpus": str(tmp_path / "busy" / "notes.txt")})
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="unknown bm25 retriever options \\['topk'\\]"):
        make_retriever("bm25", {"topk": 3})


def test_progress_bars_work_without_a_terminal(corpus: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    retriever = BM25Retriever.build_index(corpus, tmp_path / "progress", progress=True)
    assert "Indexing corpus.jsonl" in capsys.readouterr().err
    assert retriever.retrieve(["Sahara desert"], topk=1)[0][0].id == "p9"


def test_a_slow_build_says_so_on_one_line_and_an_env_build_draws_no_bar(corpus: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    size = corpus.stat().st_size
    make_retriever("bm25", {"corpus": str(corpus), "index_dir": str(tmp_path / "fast")})
    assert capsys.readouterr().err == ""  # under a few seconds: no notice, and no bar by default
    monkeypatch.setattr(bm25, "INDEX_BYTES_PER_S", size / 90)  # as if the corpus took a minute and a half
    retriever = make_retriever("bm25", {"corpus": str(corpus), "index_dir": str(tmp_path / "slow")})
    err = capsys.readouterr().err
    assert err.splitlines() == [f"skyrl-search: indexing corpus.jsonl ({size / 1e6:,.1f} MB) for BM25; done once, "
                                "later runs load the saved index (about 2 min)"]
    assert retriever.retrieve(["Sahara desert"], topk=1)[0][0].id == "p9"


def test_skyrl_check_search_output_has_no_progress_bar(tmp_path: Path) -> None:
    """The first check builds the built-in corpus's index; nothing of that build reaches the output."""
    import os
    import subprocess
    import sys

    skyrl = Path(sys.executable).with_name("skyrl")
    out = subprocess.run([str(skyrl), "check", "search", "--n-tasks", "1", "--skip", "episode", "--skip", "action"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SKYRL_SEARCH_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(tmp_path.glob("bm25-*/manifest.json"))  # the index was built by this check
    assert out.stderr == "" and all(line.startswith(("PASS", "SKIP")) or "passed" in line
                                    for line in out.stdout.splitlines()), out.stdout


def test_builtin_corpus_index_is_built_once_and_answers_gold_queries(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYRL_SEARCH_CACHE", str(tmp_path))
    first = make_retriever("bm25", {"progress": False})
    [index_dir] = tmp_path.glob("bm25-*")
    built_at = (index_dir / "manifest.json").stat().st_mtime_ns
    assert make_retriever("bm25", {}) is first
    assert (index_dir / "manifest.json").stat().st_mtime_ns == built_at
    bm25._load_shared.cache_clear()  # as a fresh process would: loads, does not rebuild
    assert make_retriever("bm25", {}) is not first
    assert (index_dir / "manifest.json").stat().st_mtime_ns == built_at

    questions = [q for q in builtin_questions("test") if len(q["gold_queries"]) == 1][:30]
    results = first.retrieve([q["gold_queries"][0] for q in questions], topk=3)
    for q, hits in zip(questions, results, strict=True):
        assert q["gold_passage_ids"][0] in [p.id for p in hits], q
