"""Evidence tools defined inside the REPL (this file's source is run in the sandbox namespace).

They read the global ``context``: ``{paper_id: {section_name: text}}``. A single paper
(``{section: text}``) or a plain string (one paper, one section) is accepted too, so the same
tools work in child REPLs that were handed part of the papers. Everything returned is a verbatim
slice of the papers, so it can be passed to ``FINAL`` unchanged.
"""

import re as _re
import unicodedata as _unicodedata

_SENTENCE_END = _re.compile(r"(?<=[.!?])\s+")


def _papers():
    ctx = globals().get("context")
    if isinstance(ctx, str):
        return {"paper": {"text": ctx}}
    if isinstance(ctx, dict) and ctx and all(isinstance(v, str) for v in ctx.values()):
        return {"paper": dict(ctx)}
    if isinstance(ctx, dict) and all(isinstance(v, dict) for v in ctx.values()):
        return {str(p): {str(s): str(t) for s, t in sections.items()} for p, sections in ctx.items()}
    raise TypeError("context is not papers: expected {paper: {section: text}}, {section: text} or a string")


def _norm(text):
    text = _unicodedata.normalize("NFKC", text).replace("-\n", "")
    return _re.sub(r"\s+", " ", text).lower().strip()


def list_papers():
    """Print and return the paper ids, each with its title (if any) and section names."""
    papers = _papers()
    for paper, sections in papers.items():
        title = sections.get("Title", "").strip()
        print(f"{paper}: {title}" if title else paper)
        print("  sections: " + ", ".join(name for name in sections if name != "Title"))
    return list(papers)


def search(query, paper=None, max_hits=10):
    """Sentences containing ``query`` (case-insensitive; falls back to all of its words)."""
    papers = _papers()
    if paper is not None and paper not in papers:
        raise KeyError(f"no paper {paper!r}; papers: {list(papers)}")
    wanted = _norm(str(query))
    words = wanted.split()
    exact, loose = [], []
    for pid, sections in papers.items():
        if paper is not None and pid != paper:
            continue
        for section, text in sections.items():
            for sentence in _SENTENCE_END.split(text):
                norm = _norm(sentence)
                hit = {"paper": pid, "section": section, "text": sentence.strip()}
                if wanted and wanted in norm:
                    exact.append(hit)
                elif words and all(w in norm for w in words):
                    loose.append(hit)
    hits = (exact or loose)[: int(max_hits)]
    if not hits:
        print(f"(no hits for {query!r})")
    for i, hit in enumerate(hits):
        print(f"[{i}] {hit['paper']} / {hit['section']}: {hit['text']}")
    return hits


def read_section(paper, section):
    """The full text of one section of one paper."""
    papers = _papers()
    if paper not in papers:
        raise KeyError(f"no paper {paper!r}; papers: {list(papers)}")
    if section not in papers[paper]:
        raise KeyError(f"paper {paper!r} has no section {section!r}; sections: {list(papers[paper])}")
    return papers[paper][section]
