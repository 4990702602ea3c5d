"""skyrl-viewer without a browser: reading run folders, the JSON API, the server's error answers, the export."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from skyrl_viewer.api import NotFound, answer, sample_path, to_json
from skyrl_viewer.export import export_html
from skyrl_viewer.runs import Run, read_jsonl
from skyrl_viewer.server import ViewerServer
from viewer_files import SKYRL

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
        assert status == 404 and kind.startswith("application/json") and "no run number" in json.loads(body)["detail"]
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


# --- malformed lines, large samples, ids, methods -------------------------------------------------

NESTED = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit: json.loads alone raises RecursionError


def test_malformed_lines_are_skipped_and_reported_like_a_truncated_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    lines = ['{"id": "a"}', '{"x": ' + NESTED + "}", '{"deep": ' + "[" * 100 + "]" * 100 + "}",
             '{"fine": ' + "[" * 99 + "]" * 99 + ', "text": "[[[[[[[[ \\" {{{{"}', '{"big": "' + "x" * 300_000 + '"}',
             '{"id": "b"}', json.dumps({"step": 2, "code": 'print("a") ' * 15_000})[:-9]]  # cut mid-string
    path.write_text("\n".join(lines))
    read = read_jsonl(path, max_line_bytes=1 << 18)
    assert [r.get("id") for r in read.records] == ["a", None, "b"]  # the line at depth 100 is kept
    assert read.problems == ["samples.jsonl: line 2 nests deeper than 100 levels and was skipped",
                             "samples.jsonl: line 3 nests deeper than 100 levels and was skipped",
                             "samples.jsonl: line 5 is larger than 0.25 MB and was skipped",
                             "samples.jsonl: the last line is incomplete (still being written?) and was skipped"]


def test_a_deeply_nested_line_leaves_the_api_answering(tmp_path):
    folder = write_run(tmp_path / "run")
    for name in ("metrics.jsonl", "samples.jsonl"):
        with open(folder / name, "a") as f:
            f.write('{"step": 3, "x": ' + NESTED + "}\n")
    runs = [Run(folder)]
    assert answer(runs, "/api/runs")["runs"][0]["problems"] == [
        "metrics.jsonl: line 3 nests deeper than 100 levels and was skipped"]
    assert [s["id"] for s in answer(runs, "/api/runs/0/samples")["samples"]] == ["root1", "child1"]
    assert answer(runs, "/api/runs/0/samples/root1")["sample"]["id"] == "root1"


def test_a_lone_surrogate_in_a_run_file_is_sent_as_its_escape(tmp_path):
    folder = write_run(tmp_path / "run", samples=[{**SAMPLE, "id": "s1"}])
    with open(folder / "samples.jsonl", "a") as f:
        f.write('{"id": "s2", "messages": [{"role": "user", "content": "half \\ud83d of a pair"}]}\n')
    body = to_json(answer([Run(folder)], "/api/runs/0/samples/s2")).encode("utf-8")  # encodable as UTF-8
    assert json.loads(body)["sample"]["messages"][0]["content"] == "half \ud83d of a pair"


def test_a_large_sample_is_cut_to_the_budget_and_its_full_text_is_one_request_away(tmp_path):
    texts = ["a" * 600_000, "b" * 300_000, "c" * 5_000]
    sample = {**SAMPLE, "messages": [{"role": "user", "content": text} for text in texts]}
    runs = [Run(write_run(tmp_path / "run", samples=[sample]))]
    detail = answer(runs, "/api/runs/0/samples/root1", max_sample_chars=200_000)["sample"]
    shown = [m["content"] for m in detail["messages"]]
    kept = [text.split("…")[0] for text in shown]
    assert kept[2] == texts[2] and len(kept[0]) == len(kept[1])  # the longest two cut to one length
    assert 190_000 < sum(map(len, kept)) <= 200_000  # with the sample's other, short texts: the budget
    assert detail["cut_chars"] == sum(map(len, texts)) - sum(map(len, kept))
    assert shown[0].endswith(f"… [{600_000 - len(kept[0]):,} more characters cut]")
    assert detail["summary"]["id"] == "root1" and detail["response_ids"] == SAMPLE["response_ids"]
    full = answer(runs, "/api/runs/0/samples/root1/full")["sample"]
    assert [m["content"] for m in full["messages"]] == texts
    assert answer(runs, "/api/runs/0/samples/root1")["sample"]["cut_chars"] > 0  # the default budget: 256 KB
    small = answer([Run(write_run(tmp_path / "small"))], "/api/runs/0/samples/root1")["sample"]
    assert small["cut_chars"] == 0 and small["messages"] == SAMPLE["messages"]


def test_sample_paths_encode_every_byte_but_the_unreserved_ones():
    assert sample_path(2, "a(b)'c*d!e ~-._/#%?ü") == "/api/runs/2/samples/a%28b%29%27c%2Ad%21e%20~-._%2F%23%25%3F%C3%BC"


def test_the_command_line_options_reach_the_export_and_a_bad_line_does_not_crash_it(tmp_path):
    sample = {**SAMPLE, "messages": [{"role": "user", "content": "z" * 50_000}]}
    folder = write_run(tmp_path / "run", samples=[sample])
    with open(folder / "samples.jsonl", "a") as f:
        f.write('{"id": "nested", "x": ' + NESTED + "}\n")
        f.write('{"id": "huge", "text": "' + "y" * (2 << 20) + '"}\n')
    out = tmp_path / "export.html"
    done = subprocess.run([str(SKYRL), "view", str(folder), "--export", str(out), "--max-sample-kb", "10",
                           "--max-line-mb", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    html = out.read_text()
    assert "samples.jsonl: line 2 nests deeper than 100 levels and was skipped" in html
    assert "samples.jsonl: line 3 is larger than 1 MB and was skipped" in html
    assert 10_000 < max(map(len, re.findall("z+", html))) <= 10_240 and "more characters cut]" in html


class RawServer:
    """A ViewerServer on loopback for raw HTTP requests."""

    def __init__(self, folder: Path) -> None:
        self.server = ViewerServer([Run(folder)], port=0)
        self.server.start()
        self.port = self.server.server_address[1]

    def request(self, method: str, path: str, body: bytes | None = None, host: str | None = None
                ) -> tuple[http.client.HTTPResponse, bytes]:
        """The response (status, headers) and its body; ``host`` replaces the Host header."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"} if body else {}
        if host is not None:
            headers["Host"] = host
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response, response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def raw_server(tmp_path) -> Iterator[RawServer]:
    server = RawServer(write_run(tmp_path / "run"))
    yield server
    server.close()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/runs/0/samples/root1", "/nothing"])
def test_other_methods_get_a_json_405_with_allow(raw_server, method, path):
    response, body = raw_server.request(method, path, body=b'{"a": 1}' if method in ("POST", "PUT", "PATCH") else None)
    assert response.status == 405 and response.getheader("Allow") == "GET, HEAD"
    assert response.getheader("Content-Type").startswith("application/json")
    assert json.loads(body) == {"detail": "Method Not Allowed: this server only answers GET and HEAD"}


def test_head_answers_like_get_without_a_body_and_unknown_methods_get_json_too(raw_server):
    (_, got), (head, head_body) = raw_server.request("GET", "/api/runs"), raw_server.request("HEAD", "/api/runs")
    assert head.status == 200 and head_body == b"" and head.getheader("Content-Length") == str(len(got))
    brew, body = raw_server.request("BREW" + "W" * 1000, "/api/runs")
    assert brew.status == 501 and brew.getheader("Allow") == "GET, HEAD"
    assert json.loads(body) == {"detail": "Not Implemented: this server only answers GET and HEAD"}  # no echo


def test_a_refused_request_with_a_body_is_not_read_as_a_second_request(raw_server):
    smuggled = b"GET /api/runs HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", raw_server.port), timeout=10) as sock:
        sock.sendall(b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(smuggled), smuggled))
        replies = b""
        while chunk := sock.recv(65536):
            replies += chunk
    assert replies.startswith(b"HTTP/1.0 405") and replies.count(b"HTTP/1.") == 1


@pytest.mark.parametrize("sent", [b"", b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["nothing", "half-a-head"])
def test_a_connection_that_never_finishes_its_request_is_closed(tmp_path, monkeypatch, sent):
    """Each connection holds a thread of the viewer: one left half-open must not hold it for ever."""
    from skyrl_viewer.server import _Handler

    monkeypatch.setattr(_Handler, "timeout", 1.0)
    server = RawServer(write_run(tmp_path / "run"))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(sent)
            assert sock.recv(65536) == b""  # closed, unanswered (a timeout here fails the test)
        assert server.request("GET", "/api/runs")[0].status == 200
    finally:
        server.close()


@pytest.mark.parametrize("host", ["rebound.attacker.example:8765", "rebound.attacker.example", "10.1.2.3:8765"])
@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/runs/0/samples/root1", "/static/app.js"])
def test_a_page_that_rebinds_its_name_to_this_machine_reads_nothing(raw_server, host, path):
    response, body = raw_server.request("GET", path, host=host)
    assert response.status == 421 and set(json.loads(body)) == {"detail"}
    assert b"samples" not in body and b"root1" not in body


def test_loopback_names_and_allowed_hosts_are_answered(tmp_path):
    server = ViewerServer([Run(write_run(tmp_path / "run"))], port=0, allowed_hosts=["gpu-box.lab"])
    server.start()
    try:
        for host in ("localhost:1", "127.0.0.1", "[::1]:8765", "GPU-box.lab:8765"):
            connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
            connection.request("GET", "/api/runs", headers={"Host": host})
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read())["runs"], host
            connection.close()
    finally:
        server.shutdown()
        server.server_close()


# --- results folders of skyrl eval -----------------------------------------------------------------

def test_an_eval_folder_is_read_like_a_run_with_its_summary_and_no_metrics_problem(eval_folder, tmp_path):
    runs = [Run(eval_folder), Run(write_run(tmp_path / "run"))]
    evaluated, trained = answer(runs, "/api/runs")["runs"]
    assert (evaluated["model"], evaluated["env"], evaluated["steps"], evaluated["problems"]) == (
        "tiny-random", "reverse_text", 0, [])  # the model comes from config.yaml's engine section
    summary = evaluated["eval"]
    assert summary["problems"] == [] and summary["info"]["samples_per_task"] == 2
    assert {"eval/pass@1", "eval/pass@2", "eval/mean@2", "reward/mean"} <= set(summary["metrics"])
    assert [row["n"] for row in summary["per_task"]["tasks"]] == [2, 2]
    assert "eval" not in trained
    assert answer(runs, "/api/runs/0/metrics") == {"rows": [], "total": 0, "problems": []}
    samples = answer(runs, "/api/runs/0/samples")["samples"]
    assert len(samples) == 4 and {s["step"] for s in samples} == {None} and {s["env_id"] for s in samples} == {
        "reverse_text"}
    detail = answer(runs, sample_path(0, samples[0]["id"]))["sample"]
    assert detail["token_text"]["response"] is not None  # tiny-random's tokenizer: the token view has text
    exported = export_html(runs[:1], tmp_path / "eval.html").read_text()
    assert '"eval/pass@2"' in exported


def test_a_broken_eval_folder_gives_problems_not_exceptions(eval_folder, tmp_path):
    import shutil

    broken = shutil.copytree(eval_folder, tmp_path / "broken")
    (broken / "per_task.json").write_text('{"tasks": [')
    (broken / "metrics.json").write_text("[1, 2]")
    problems = ["metrics.json is not a JSON object", "per_task.json is not valid JSON"]
    assert Run(broken).evaluation()["problems"] == problems
    assert answer([Run(broken)], "/api/runs/0/metrics")["problems"] == problems
    assert answer([Run(broken)], "/api/runs")["runs"][0]["eval"]["per_task"] == {}
