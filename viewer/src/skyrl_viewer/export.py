"""``skyrl view --export FILE.html``: one self-contained file with the page, its data and plotly.js.

The file holds the answers the server would give (:mod:`skyrl_viewer.api`) keyed by API path, so the
same page script runs from disk with no server and no network; it shows the runs as they were when
exported (no live updates).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_viewer.api import DEFAULT_MAX_SAMPLE_CHARS, answer, sample_detail, sample_path, to_json
from skyrl_viewer.assets import PLOTLY_NAME, plotly_path, static_text
from skyrl_viewer.runs import Run

_SCRIPT_END = re.compile(r"</(script)", re.IGNORECASE)


def exported_responses(runs: Sequence[Run], max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS) -> dict[str, Any]:
    """Every API answer the page can ask for, by path (not a sample's full text: large ones stay cut)."""
    responses: dict[str, Any] = {"/api/runs": answer(runs, "/api/runs")}
    for index in range(len(runs)):
        base = f"/api/runs/{index}"
        responses[f"{base}/metrics"] = answer(runs, f"{base}/metrics")
        samples = answer(runs, f"{base}/samples")
        responses[f"{base}/samples"] = samples
        for sample in samples["samples"]:  # by the path the page asks for, not through a decoded URL
            detail = sample_detail(runs[index], sample["id"], max_sample_chars)
            responses[sample_path(index, sample["id"])] = {"sample": detail}
    return responses


def export_html(runs: Sequence[Run], target: str | Path, max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS) -> Path:
    """Write the self-contained page for ``runs`` to ``target`` and return its path."""
    data = to_json(exported_responses(runs, max_sample_chars)).replace("<", "\\u003c")  # no markup can open inside
    html = static_text("index.html")
    replacements = {
        '<link rel="stylesheet" href="static/app.css">': f"<style>\n{static_text('app.css')}</style>",
        f'<script src="static/{PLOTLY_NAME}"></script>': _inline_script(plotly_path().read_text(encoding="utf-8")),
        '<script src="static/app.js"></script>': _inline_script(f"window.SKYRL_EXPORT = {data};")
        + _inline_script(static_text("app.js")),
    }
    for tag, inline in replacements.items():
        if tag not in html:
            raise RuntimeError(f"index.html lost its tag {tag!r}; the export cannot inline it")
        html = html.replace(tag, inline)
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


def _inline_script(code: str) -> str:
    """``code`` in a script element; ``</script`` inside it is escaped (``<\\/`` means the same in JS)."""
    escaped = _SCRIPT_END.sub(r"<\\/\1", code)
    return f"<script>\n{escaped}\n</script>"
