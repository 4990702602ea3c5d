"""skyrl-viewer without a browser: reading run folders, the JSON API, the server's error answers, the export."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from skyrl_viewer.api import NotFound, answer, to_json
from skyrl_viewer.export import export_html
from skyrl_viewer.runs import Run, read_jsonl
from skyrl_viewer.server import ViewerServer

SAMPLE = {"id": "root1", "parent_id": None, "depth": 0, "reward": 0.5, "stop_reason": "terminated", "env_id": "sql",
          "messages": [{"role": "system", "content": "Answer with SQL."}, {"role": "user", "content": "How many?"},
                       {"role": "assistant", "content": "<sql>SELECT COUNT(*) FROM t</sql>"},
                       {"role": "user", "content": "<observation>count\n    3</observation>"}],
          "turns": [{"action": "<sql>SELECT COUNT(*) FROM t</sql>", "observation": [], "info": {"final_answer": "3"}}],
          "response_ids": [5, 6, 7], "loss_mask": [1, 1, 0], "logprobs": [-0.1, -2.0, 0.0], "prompt_ids": [1, 2],
          "metrics": {"train_step": 1.0, "advantage": 0.7}}
CHILD = {**SAMPLE, "id": "child1", "parent_id": "root1", "depth": 1, "task": {"prompt": "CHILD: sub-question"}}


def write_run(folder: Path, steps: int = 2, samples: list[dict] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": s / 10, "reward/std": 0.1, "train/loss": 1.0 / s}) + "\n"
        for s in range(1, steps + 1)))
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples or [SAMPLE, CHILD]))
    (folder / "config.yaml").write_text("env:\n  id: sql\ntrainer:\n  model: no-such-model\n")
    return folder


def test_a_truncated_last_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "reward/me')
    lines = read_jsonl(path)
    assert lines.records == [{"step": 1}]
    assert lines.problems == ["metrics.jsonl: the last line is incomplete (still being written?) and was skipped"]
    path.write_text('{"step": 1}\nnot json\n[1]\n{"step": 3}\n')
    assert read_jsonl(path).problems == ["metrics.jsonl: line 2 is not valid JSON and was skipped",
                                         "metrics.jsonl: line 3 is not a JSON object and was skipped"]


def test_bad_folders_give_problems_not_exceptions(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "metrics.jsonl").write_text("")
    (tmp_path / "a_file").write_text("x")
    assert Run(tmp_path / "missing").metrics().problems == [f"{tmp_path / 'missing'} does not exist"]
    assert Run(tmp_path / "a_file").samples().problems == [f"{tmp_path / 'a_file'} is not a folder"]
    assert "no metrics.jsonl in" in Run(tmp_path / "empty").metrics().problems[0]
    assert "no samples.jsonl in" in Run(tmp_path / "empty").samples().problems[0]
    assert Run(tmp_path / "zero").metrics().problems == [
        "metrics.jsonl holds no steps yet: the run has not finished its first step"]
    summary = answer([Run(tmp_path / "empty")], "/api/runs")["runs"][0]
    assert summary["steps"] == 0 and summary["model"] is None and summary["problems"]


def test_api_answers(tmp_path):
    runs = [Run(write_run(tmp_path / "run", steps=3))]
    assert answer(runs, "/api/runs")["runs"][0] | {"path": None} == {
        "index": 0, "name": "run", "path": None, "model": "no-such-model", "env": "sql", "steps": 3, "problems": []}
    metrics = answer(runs, "/api/runs/0/metrics?from=2")
    assert [r["step"] for r in metrics["rows"]] == [3] and metrics["total"] == 3
    samples = answer(runs, "/api/runs/0/samples")["samples"]
    assert [(s["id"], s["parent_id"], s["advantage"], s["step"]) for s in samples] == [
        ("root1", None, 0.7, 1.0), ("child1", "root1", 0.7, 1.0)]
    assert samples[0]["title"] == "How many?" and samples[1]["title"] == "CHILD: sub-question"
    assert samples[0]["final_answer"] == "3"
    detail = answer(runs, "/api/runs/0/samples/root1")["sample"]
    assert detail["messages"] == SAMPLE["messages"] and detail["token_text"] == {"prompt": None, "response": None}
    for bad in ("/api/runs/1/metrics", "/api/runs/x/samples", "/api/runs/0/samples/nope", "/api/other"):
        with pytest.raises(NotFound):
            answer(runs, bad)


def test_non_finite_numbers_become_null():
    assert json.loads(to_json({"a": float("nan"), "b": [float("inf"), 1.5]})) == {"a": None, "b": [None, 1.5]}


def test_the_server_answers_errors_as_json(tmp_path):
    folder = write_run(tmp_path / "run")
    (folder / "metrics.jsonl").write_text('{"step": 1, "train/loss": NaN}\n')
    server = ViewerServer([Run(folder)], port=0)
    server.start()
    try:
        def get(path: str) -> tuple[int, bytes, str]:
            try:
                with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=10) as response:
                    return response.status, response.read(), response.headers["Content-Type"]
            except urllib.error.HTTPError as error:
                return error.code, error.read(), error.headers["Content-Type"]

        status, body, kind = get("/api/runs/0/metrics")
        assert status == 200 and json.loads(body)["rows"] == [{"step": 1, "train/loss": None}]
        status, body, kind = get("/api/runs/7/samples")
        assert status == 404 and kind.startswith("application/json") and "no run number" in json.loads(body)["error"]
        assert get("/nothing")[0] == 404
        assert get("/")[0] == 200 and b'<script src="static/app.js">' in get("/")[1]
        status, body, _ = get("/static/plotly.min.js")
        assert status == 200 and len(body) > 1_000_000
    finally:
        server.shutdown()
        server.server_close()


def test_export_is_one_file_with_nothing_to_fetch(tmp_path):
    sample = {**SAMPLE, "messages": [{"role": "user", "content": "</script><script>alert(1)</script>"}]}
    path = export_html([Run(write_run(tmp_path / "run", samples=[sample]))], tmp_path / "out" / "run.html")
    html = path.read_text()
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)  # plotly.js holds link texts of its own
    assert "<style>" in markup and not re.search(r"""(src|href)=["']?(https?:|//|static/)""", markup)
    assert html.count("<script>") == html.count("</script>") == 3  # plotly, data, app: the data's tag stays text
    assert "window.SKYRL_EXPORT" in html and "/api/runs/0/samples/root1" in html


def test_skyrl_view_is_a_registered_command():
    from skyrl_core.cli import build_app
    from typer.testing import CliRunner

    result = CliRunner().invoke(build_app(), ["view", "--help"])
    assert result.exit_code == 0 and "--export" in result.output and "--port" in result.output
