"""Make evidence-selection tasks from a folder of papers (plain text or text extracted from PDF).

    python -m skyrl_rlm_repl.make_dataset PAPERS_DIR OUT.jsonl [--max-tasks 40] [--papers-per-task 4]

Each ``*.txt`` file is one paper: its first non-empty line is the title, and sections start at
heading lines (numbered like ``3 Method`` / ``3.1 Setup``, markdown ``# Heading``, or a known name
such as ``Abstract`` or ``Conclusion``). Section text is kept verbatim, extraction noise included;
``References`` is dropped.

Questions are lexical: a key phrase (two or three content words) that occurs in a few sentences
is chosen, and every sentence containing it, in any paper, is the gold evidence. The task's papers
are those with evidence plus random distractors. Such questions teach the tool-use loop (search,
read, quote); for harder tasks, write questions by hand in the same JSONL format
(see :mod:`skyrl_rlm_repl.evidence.dataset`). The output is validated before it is written.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_rlm_repl.evidence.dataset import validate_row

KNOWN_HEADINGS = {"abstract", "introduction", "background", "related work", "method", "methods", "approach",
                  "experiments", "experimental setup", "evaluation", "results", "discussion", "limitations",
                  "conclusion", "conclusions", "data", "acknowledgements", "acknowledgments", "references",
                  "bibliography", "appendix"}
DROPPED = {"references", "bibliography"}
_NUMBERED = re.compile(r"^(\d+(\.\d+)*\.?|[IVX]+\.)\s+[A-Z][^\n]{0,70}$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z][a-z0-9]+(?:-[a-z0-9]+)*")
STOPWORDS = set("""a about above after again against all also an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had has have having
he her here hers how i if in into is it its itself just more most much no nor not now of off on once only or other
our out over own same she should so some such than that the their them then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you your every one
two three four five six seven eight nine ten per using used use new first second""".split())
QUESTIONS = ("Which passages discuss {term}?", "Quote every sentence that mentions {term}.",
             "Find the evidence about {term} across the papers.", "What do the papers say about {term}? "
             "Return the supporting sentences.")


@dataclass(frozen=True)
class Sentence:
    paper: str
    section: str
    text: str


def read_paper(path: Path) -> dict[str, str]:
    """``{"Title": ..., section: text}`` for one paper file."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    lines = [line.rstrip() for line in lines]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        raise ValueError(f"{path}: empty file")
    sections: dict[str, list[str]] = {"Title": [lines[0].strip()]}
    current = "Front matter"
    for line in lines[1:]:
        heading = _heading(line)
        if heading is not None:
            current = heading
            sections.setdefault(current, [])
        else:
            sections.setdefault(current, []).append(line)
    out = {}
    for name, body in sections.items():
        text = "\n".join(body).strip()
        if text and name.lower().lstrip("0123456789. ") not in DROPPED:
            out[name] = text
    return out


def _heading(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or len(stripped) > 80 or stripped.endswith((".", ",", ";")):
        return None
    if stripped.startswith("#"):
        return stripped.lstrip("#").strip() or None
    if _NUMBERED.match(stripped):
        return stripped
    return stripped if stripped.lower() in KNOWN_HEADINGS else None


def sentences(papers: dict[str, dict[str, str]]) -> list[Sentence]:
    out = []
    for paper, sections in papers.items():
        for section, text in sections.items():
            if section == "Title":
                continue
            out += [Sentence(paper, section, s.strip()) for s in _SENTENCE_END.split(text) if len(s.strip()) > 20]
    return out


def normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).replace("-\n", "")
    return re.sub(r"\s+", " ", text).lower()


def key_phrases(all_sentences: Sequence[Sentence], max_evidence: int) -> list[tuple[str, list[Sentence]]]:
    """Phrases of 2-3 content words with their sentences, multi-paper and rarer phrases first."""
    found: dict[str, list[Sentence]] = defaultdict(list)
    for sentence in all_sentences:
        words = _WORD.findall(normalise(sentence.text))
        phrases = set()
        for n in (2, 3):
            for i in range(len(words) - n + 1):
                gram = words[i:i + n]
                if gram[0] not in STOPWORDS and gram[-1] not in STOPWORDS and all(len(w) > 2 for w in gram):
                    phrases.add(" ".join(gram))
        for phrase in phrases:
            found[phrase].append(sentence)
    # The gold set is every sentence holding the phrase as text (as the search tool finds it),
    # so "language model" also covers "language models".
    normalised = [(s, normalise(s.text)) for s in all_sentences]
    hits = {p: [s for s, text in normalised if p in text] for p, s in found.items() if len(s) <= max_evidence}
    ranked = [(p, s) for p, s in hits.items() if 1 <= len(s) <= max_evidence]
    ranked.sort(key=lambda item: (-len({s.paper for s in item[1]}), -len(item[1]), item[0]))
    return ranked


def make_tasks(papers: dict[str, dict[str, str]], *, max_tasks: int, papers_per_task: int, max_evidence: int,
               validation_fraction: float, test_fraction: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    used: list[set[str]] = []
    for phrase, hits in key_phrases(sentences(papers), max_evidence):
        if len(tasks) >= max_tasks:
            break
        texts = {s.text for s in hits}
        if any(texts <= seen or seen <= texts for seen in used):
            continue
        used.append(texts)
        evidence_papers = sorted({s.paper for s in hits})
        others = sorted(set(papers) - set(evidence_papers))
        chosen = evidence_papers + rng.sample(others, max(0, min(len(others), papers_per_task - len(evidence_papers))))
        rng.shuffle(chosen)
        draw = rng.random()
        split = "validation" if draw < validation_fraction else "test" if draw < validation_fraction + test_fraction else "train"
        tasks.append({"id": f"ev{len(tasks):04d}", "split": split,
                      "question": rng.choice(QUESTIONS).format(term=f'"{phrase}"'),
                      "papers": {p: papers[p] for p in chosen},
                      "evidence": [{"paper": s.paper, "section": s.section, "text": s.text} for s in hits]})
    return tasks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("papers_dir", type=Path, help="folder of *.txt papers")
    parser.add_argument("out", type=Path, help="JSONL file to write")
    parser.add_argument("--max-tasks", type=int, default=40)
    parser.add_argument("--papers-per-task", type=int, default=4)
    parser.add_argument("--max-evidence", type=int, default=4, help="most gold sentences per question")
    parser.add_argument("--validation-fraction", type=float, default=0.15)
    parser.add_argument("--test-fraction", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    files = sorted(args.papers_dir.glob("*.txt"))
    if not files:
        print(f"error: no *.txt papers in {args.papers_dir}", file=sys.stderr)
        return 2
    papers = {f.stem: read_paper(f) for f in files}
    tasks = make_tasks(papers, max_tasks=args.max_tasks, papers_per_task=args.papers_per_task,
                       max_evidence=args.max_evidence, validation_fraction=args.validation_fraction,
                       test_fraction=args.test_fraction, seed=args.seed)
    for number, task in enumerate(tasks, 1):
        try:
            validate_row(task)
        except ValueError as exc:
            print(f"error: task {number} ({task['id']}) is invalid: {exc}", file=sys.stderr)
            return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task, ensure_ascii=False) + "\n")
    splits = ", ".join(f"{sum(t['split'] == s for t in tasks)} {s}" for s in ("train", "validation", "test"))
    print(f"wrote {len(tasks)} tasks from {len(papers)} papers to {args.out} ({splits})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
