"""Evidence datasets: the built-in set, errors that name the line, and the generator script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skyrl_rlm_repl.env import RLMReplEnv
from skyrl_rlm_repl.evidence.dataset import DatasetError, load_tasks
from skyrl_rlm_repl.evidence.reward import SourceIndex
from skyrl_rlm_repl.make_dataset import main, read_paper

GOOD = {"id": "a", "question": "Q?", "papers": {"p": {"Intro": "Alpha beta gamma. Delta epsilon."}},
        "evidence": ["Alpha beta gamma."]}


def write_rows(path: Path, *rows: object) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_builtin_dataset_has_both_splits_and_grounded_gold(evidence_tasks):
    validation = RLMReplEnv.load_dataset("validation")
    assert len(evidence_tasks) >= 20 and len(validation) >= 5
    assert {t["split"] for t in evidence_tasks} == {"train"}
    for task in evidence_tasks + list(validation):
        assert len(task["papers"]) >= 2
        assert all(SourceIndex(task["papers"]).contains(e) for e in task["evidence"])


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "Expecting property name"),
    ({k: v for k, v in GOOD.items() if k != "papers"}, "missing field(s) ['papers']"),
    ({**GOOD, "evidence": ["Zeta eta theta."]}, "evidence[0] does not occur in the papers"),
    ({**GOOD, "evidence": [{"paper": "p"}]}, "evidence[0] must be a non-empty string or an object with a 'text'"),
    ({**GOOD, "papers": {"p": "flat text"}}, "papers['p'] must be an object"),
    ({**GOOD, "split": "dev"}, "'split' must be one of"),
    ({**GOOD, "question": ""}, "'question' must be a non-empty string"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = write_rows(tmp_path / "tasks.jsonl", GOOD, {**GOOD, "id": "b"}, row)
    with pytest.raises(DatasetError) as err:
        load_tasks(path)
    assert f"{path}:3: " in str(err.value) and message in str(err.value)


def test_duplicate_ids_unknown_split_and_missing_file(tmp_path):
    path = write_rows(tmp_path / "tasks.jsonl", GOOD, "", GOOD)
    with pytest.raises(DatasetError, match=r"tasks.jsonl:3: duplicate id 'a' \(first on line 1\)"):
        load_tasks(path)
    with pytest.raises(DatasetError, match="unknown split 'dev'; splits: train, validation, test"):
        load_tasks(path, "dev")
    with pytest.raises(DatasetError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")


def test_env_reads_a_dataset_path_from_its_config(tmp_path):
    path = write_rows(tmp_path / "tasks.jsonl", GOOD, {**GOOD, "id": "v", "split": "validation"})
    config = RLMReplEnv.config_class(dataset_path=str(path))
    assert [t["id"] for t in RLMReplEnv.load_dataset("validation", config)] == ["v"]


PAPER_A = """A Study of Sparse Attention

Abstract
Sparse attention reduces the cost of long inputs. We measure memory use on long
documents and find a four-fold reduction.

1 Introduction
Long documents are expensive. Sparse attention keeps only nearby tokens and a few global
tokens, which cuts memory use while keeping accuracy.

2 Results
Memory use fell from 80 GB to 20 GB. The eﬀective context grew to 128k tokens with sparse
atten-
tion and no loss of accuracy.

References
[1] Someone. A paper. 2020.
"""
PAPER_B = """Retrieval for Long Documents

# Abstract
Retrieval selects passages before reading. It competes with sparse attention on long
documents.

# Method
We index every paragraph and retrieve the top five. Memory use stays constant.
"""


def test_read_paper_finds_title_sections_and_drops_references(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(PAPER_A, encoding="utf-8")
    paper = read_paper(path)
    assert list(paper) == ["Title", "Abstract", "1 Introduction", "2 Results"]
    assert paper["Title"] == "A Study of Sparse Attention"
    assert "atten-\ntion" in paper["2 Results"]  # kept verbatim, extraction noise included


def test_make_dataset_script_writes_valid_tasks_from_a_folder(tmp_path):
    papers = tmp_path / "papers"
    papers.mkdir()
    (papers / "sparse.txt").write_text(PAPER_A, encoding="utf-8")
    (papers / "retrieval.txt").write_text(PAPER_B, encoding="utf-8")
    out = tmp_path / "tasks.jsonl"
    done = subprocess.run([sys.executable, "-m", "skyrl_rlm_repl.make_dataset", str(papers), str(out),
                           "--max-tasks", "5", "--validation-fraction", "0", "--test-fraction", "0"], capture_output=True, text=True, check=True)
    assert "wrote 5 tasks from 2 papers" in done.stdout
    tasks = load_tasks(out)
    assert len(tasks) == 5
    by_question = {t["question"]: t for t in tasks}
    sparse = next(t for q, t in by_question.items() if '"sparse attention"' in q)
    assert set(sparse["papers"]) == {"sparse", "retrieval"}
    # Every sentence with the phrase, in both papers, across a hyphenation break too.
    assert len(sparse["evidence"]) == 4
    assert "The eﬀective context grew to 128k tokens with sparse\natten-\ntion and no loss of accuracy." in sparse["evidence"]


def test_make_dataset_fails_clearly_on_an_empty_folder(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out.jsonl")]) == 2
    assert "no *.txt papers" in capsys.readouterr().err
