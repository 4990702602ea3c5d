"""``skyrl view`` in headless Chromium, on folders of real tiny-random training runs and on broken folders.

Each test saves a screenshot of the view it checks under the ``artifacts`` folder (see conftest).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from skyrl_viewer.export import export_html
from skyrl_viewer.runs import Run
from test_viewer_api import CHILD, SAMPLE, write_run
from viewer_files import SKYRL, jsonl

REWARD_POINTS = """(run) => document.getElementById('chart-reward').data
    .filter((t) => t.meta.kind === 'raw' && t.meta.run === run).map((t) => t.x.length)[0]"""
CHART_READY = "() => { const d = document.getElementById('chart-reward'); return !!(d && d.data && d.data.length); }"


def reward_points(page, run: int = 0) -> int:
    page.wait_for_function(CHART_READY)
    return page.evaluate(REWARD_POINTS, run)


def test_bad_folders_show_clear_messages(tmp_path, serve, page, artifacts):
    good = write_run(tmp_path / "good", steps=2)
    truncated = write_run(tmp_path / "truncated", steps=3)
    for name in ("metrics.jsonl", "samples.jsonl"):
        with open(truncated / name, "a") as f:
            f.write('{"step": 4, "reward/me')  # the trainer is mid-write
    zero = tmp_path / "zero_steps"
    zero.mkdir()
    (zero / "metrics.jsonl").write_text("")
    empty = tmp_path / "empty"
    empty.mkdir()
    nested = write_run(tmp_path / "nested", steps=2)
    with open(nested / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    # a folder removed while the viewer runs (skyrl view refuses one that is missing at the start)
    gone = tmp_path / "missing"
    gone.mkdir()
    viewer = serve(good, truncated, zero, empty, gone, nested)
    gone.rmdir()
    page.goto(viewer.url)
    assert reward_points(page, 0) == 2 and reward_points(page, 1) == 3 and reward_points(page, 5) == 2
    notices = page.locator("#notices").inner_text()
    for expected in ("metrics.jsonl: the last line is incomplete (still being written?) and was skipped",
                     "metrics.jsonl holds no steps yet", "no metrics.jsonl in", "missing does not exist",
                     "metrics.jsonl: line 3 nests deeper than 100 levels and was skipped"):
        assert expected in notices
    page.screenshot(path=str(artifacts / "bad-folders-metrics.png"), full_page=True)
    page.goto(viewer.url + "#samples")
    page.locator("#run-select").select_option("1")
    page.wait_for_selector("#sample-problems .notice")
    assert page.locator("#sample-problems").inner_text() == (
        "samples.jsonl: the last line is incomplete (still being written?) and was skipped")
    page.wait_for_selector("#sample-detail[data-sample-id='root1']")  # the complete lines still show

    gone.mkdir()
    viewer = serve(zero, empty, gone)
    gone.rmdir()
    page.goto(viewer.url)
    page.wait_for_selector("#no-metrics")
    assert "No metrics to chart: metrics.jsonl holds no steps yet" in page.locator("#no-metrics").inner_text()
    page.goto(viewer.url + "#samples")
    page.wait_for_selector("#no-samples")
    assert "no samples.jsonl in" in page.locator("#no-samples").inner_text()
    page.goto(viewer.url + "#trees")
    page.wait_for_selector("#no-trees")
    page.screenshot(path=str(artifacts / "bad-folders-trees.png"), full_page=True)


def test_steps_without_learning_signal_are_shaded_on_every_chart(tmp_path, serve, page, artifacts):
    folder = write_run(tmp_path / "flat", steps=6)
    streaks = [0, 1, 2, 0, 1, 0]  # train/no_signal_steps as fsdp_grpo logs it
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward/mean": 0.5, "train/loss": 0.0, "train/zero_variance_groups": 1.0 if k else 0.2,
                    "train/no_signal_steps": float(k)}) + "\n" for s, k in enumerate(streaks, start=1)))
    page.goto(serve(folder).url)
    page.wait_for_function(CHART_READY)
    page.wait_for_selector("#chart-zero-variance .main-svg")
    for chart in ("reward", "loss", "zero-variance"):
        shapes = page.evaluate(f"() => document.getElementById('chart-{chart}').layout.shapes"
                               ".map((s) => [s.x0, s.x1])")
        assert shapes == [[1.5, 3.5], [4.5, 5.5]], chart  # steps 2-3 and step 5
    page.screenshot(path=str(artifacts / "no-signal-steps.png"), full_page=True)


def test_an_eval_folder_shows_its_summary_and_its_samples(eval_folder, tmp_path, serve, page, artifacts):
    records = jsonl(eval_folder / "samples.jsonl")
    per_task = json.loads((eval_folder / "per_task.json").read_text())
    page.goto(serve(eval_folder).url)
    page.wait_for_selector("#eval-summary .eval-tasks")
    summary = page.locator("#eval-summary").inner_text()
    for expected in ("Evaluation: eval", "model tiny-random", "split test", "samples per task 2", "eval/pass@1",
                     "eval/pass@2", "reward/mean"):
        assert expected in summary
    assert page.locator("#eval-summary .eval-tasks tr").count() == 1 + len(per_task["tasks"]) == 3
    assert page.locator("#no-metrics").count() == 0 and page.locator("#notices .notice").count() == 0
    assert page.locator("#chart-controls").is_hidden()  # no training steps: nothing to smooth or add
    page.screenshot(path=str(artifacts / "eval-summary.png"), full_page=True)

    page.goto(page.url.split("#")[0] + "#samples")  # the same sample view as a run's
    items = page.locator("#sample-list li[data-sample-id]")
    items.first.wait_for()
    assert items.count() == len(records) == 4
    assert page.locator("#step-select option").all_inner_texts() == ["evaluation"]
    item = items.nth(1)
    record = {r["id"]: r for r in records}[item.get_attribute("data-sample-id")]
    item.click()
    page.wait_for_selector(f"#sample-detail[data-sample-id='{record['id']}'] #tokens .tok")
    conversation = page.locator("#sample-detail .conversation").inner_text()
    assert all(message["content"] in conversation for message in record["messages"][:2])
    assert page.locator("#tokens .tok").count() == len(record["response_ids"])
    page.screenshot(path=str(artifacts / "eval-samples.png"), full_page=True)

    page.goto(serve(write_run(tmp_path / "run", steps=2), eval_folder).url)  # beside a run: its charts and this summary
    assert reward_points(page, 0) == 2 and page.locator("#eval-summary section.eval").count() == 1
    assert page.locator("#chart-controls").is_visible()


@pytest.mark.slow
def test_metrics_have_one_point_per_step_and_overlay_runs(trained_runs, serve, page, artifacts):
    runs = [trained_runs["reverse_text"], trained_runs["rlm_tree"]]
    viewer = serve(*runs)
    page.goto(viewer.url)
    for index, folder in enumerate(runs):
        assert reward_points(page, index) == len([r for r in jsonl(folder / "metrics.jsonl") if "reward/mean" in r]) == 2
    # the held-out evaluation (before training and after the last step) has charts of its own
    evals = page.evaluate("() => document.getElementById('chart-eval-reward').data.map((t) => t.x)")
    assert evals == [[0, 2], [0, 2]]
    legend = page.locator("#chart-reward g.legend").text_content()
    assert "reverse_text" in legend and "rlm_tree" in legend
    for chart in ("loss", "kl", "entropy", "grad-norm", "zero-variance", "clip-fraction", "logprob-gap", "tokens",
                  "step-time", "eval-pass-rate", "eval-task-reward"):
        assert page.locator(f"#chart-{chart} .main-svg").count(), chart
    page.locator("#env-section summary").click()  # the env's own metrics (env/*), one chart each
    page.wait_for_selector("#chart-env-tree_depth_reached .main-svg")
    page.screenshot(path=str(artifacts / "metrics.png"), full_page=True)
    page.locator("#more-metrics").select_option("rollout/turns_mean")  # any logged number gets a chart
    page.wait_for_selector("#chart-rollout-turns_mean .main-svg")
    page.locator("#smoothing").fill("0.5")  # smoothed line over the faint raw one
    kinds = page.evaluate("() => document.getElementById('chart-reward').data.map((t) => t.meta.kind)")
    assert kinds.count("smoothed") == 2 and kinds.count("raw") == 2


@pytest.mark.slow
def test_clicking_a_sample_shows_its_conversation_and_tokens(trained_runs, serve, page, artifacts):
    folder = trained_runs["reverse_text"]
    records = {r["id"]: r for r in jsonl(folder / "samples.jsonl")}
    page.goto(serve(folder).url + "#samples")
    items = page.locator("#sample-list li[data-sample-id]")
    items.first.wait_for()
    item = items.nth(1)
    record = records[item.get_attribute("data-sample-id")]
    item.click()
    page.wait_for_selector(f"#sample-list li.selected[data-sample-id='{record['id']}']")
    page.wait_for_selector(f"#sample-detail[data-sample-id='{record['id']}'] #tokens .tok")
    conversation = page.locator("#sample-detail .conversation")
    for message in record["messages"][:2]:  # system prompt and task: text the random model did not write
        assert message["content"] in conversation.inner_text()
    assert conversation.locator(".msg").count() == len(record["messages"])
    assert page.locator("#tokens .tok").count() == len(record["response_ids"])
    assert page.locator("#tokens .tok.masked").count() == record["loss_mask"].count(0)
    first = page.locator("#tokens .tok").first.get_attribute("title")
    assert f"logprob {record['logprobs'][0]:.3f}" in first
    page.screenshot(path=str(artifacts / "samples.png"), full_page=True)


@pytest.mark.slow
def test_rlm_tree_shows_children_linked_from_call_sites(trained_runs, serve, page, artifacts):
    folder = trained_runs["rlm_tree"]
    records = jsonl(folder / "samples.jsonl")
    root = records[0]
    children = [r for r in records if r["parent_id"] == root["id"]]
    grandchildren = [r for r in records if r["parent_id"] in {c["id"] for c in children}]
    assert len(children) == 2 and len(grandchildren) == 2  # stored by the trainer with their parent links
    roots = [r for r in records if r["parent_id"] is None]
    assert [r["metrics"]["train_step"] for r in roots] == [1.0, 2.0]  # trainer.samples_per_step=1 root a step
    assert all("advantage" in r["metrics"] for r in records)
    page.goto(serve(folder).url + "#trees")
    page.wait_for_selector(f".node[data-node-id='{root['id']}']")
    assert page.locator(".node[data-depth='1']").count() == 2
    assert page.locator(".node[data-depth='2']").count() == 2
    tree = page.locator("#tree").inner_text()
    assert "CHILD: first word?" in tree and "CHILD: last word?" in tree and "LEAF: a word?" in tree
    page.locator("#tree-detail a.call-site").first.click()  # the root's rlm_query_batched call site
    assert page.locator(".node.flash").count() == 2
    child = children[0]
    page.locator(f".node[data-node-id='{child['id']}']").click()
    page.wait_for_selector(f"#tree-detail[data-sample-id='{child['id']}']")
    assert page.locator("#tree-detail h2").inner_text() == "CHILD: first word?"
    assert f"advantage {child['metrics']['advantage']:g}" in page.locator("#tree-detail").inner_text()
    page.screenshot(path=str(artifacts / "trees.png"), full_page=True)


@pytest.mark.slow
def test_live_update_adds_a_point_when_a_metrics_line_is_written(trained_runs, tmp_path, serve, page, artifacts):
    folder = Path(shutil.copytree(trained_runs["reverse_text"], tmp_path / "live", ignore=shutil.ignore_patterns("checkpoints", "export")))
    page.goto(serve(folder).url)
    assert reward_points(page) == 2
    last = jsonl(folder / "metrics.jsonl")[-1]
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**last, "step": 3, "reward/mean": 0.5}) + "\n")
    page.wait_for_function(f"() => ({REWARD_POINTS})(0) === 3", timeout=10_000)
    page.screenshot(path=str(artifacts / "live-update.png"), full_page=True)


def test_live_update_adds_a_new_steps_tree(trained_runs, tmp_path, serve, page, artifacts):
    folder = Path(shutil.copytree(trained_runs["rlm_tree"], tmp_path / "live-trees", ignore=shutil.ignore_patterns("checkpoints", "export")))
    records = jsonl(folder / "samples.jsonl")
    page.goto(serve(folder).url + "#trees")
    page.wait_for_selector("#tree-list li[data-root-id]")
    assert page.locator("#tree-list li[data-root-id]").count() == 2  # one root a step
    # step 3: the first tree again under new ids (its samples, then the metrics line, as the trainer writes them)
    root = records[0]
    next_root = next(i for i, r in enumerate(records) if i and r["parent_id"] is None)
    tree = records[:next_root]  # a root, then its descendants depth-first
    renamed = {r["id"]: f"{r['id']}-step3" for r in tree}
    with open(folder / "samples.jsonl", "a") as f:
        for r in tree:
            f.write(json.dumps({**r, "id": renamed[r["id"]], "parent_id": renamed.get(r["parent_id"]),
                                "metrics": {**r["metrics"], "train_step": 3.0}}) + "\n")
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**jsonl(folder / "metrics.jsonl")[-1], "step": 3}) + "\n")
    page.wait_for_selector(f"#tree-list li[data-root-id='{renamed[root['id']]}']", timeout=10_000)
    assert page.locator("#tree-list li[data-root-id]").count() == 3
    page.locator(f"#tree-list li[data-root-id='{renamed[root['id']]}']").click()
    assert page.locator(".node[data-depth='1']").count() == 2 and page.locator(".node[data-depth='2']").count() == 2
    page.screenshot(path=str(artifacts / "live-trees.png"), full_page=True)


@pytest.mark.slow
def test_export_opens_from_disk_without_network(trained_runs, tmp_path, page, artifacts):
    out = tmp_path / "export.html"
    done = subprocess.run([str(SKYRL), "view", str(trained_runs["reverse_text"]), str(trained_runs["rlm_tree"]),
                           "--export", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    requests: list[str] = []
    page.context.route("**/*", lambda route: (requests.append(route.request.url),
                                              route.continue_() if route.request.url.startswith(("file:", "data:"))
                                              else route.abort()))
    page.goto(out.as_uri())
    assert reward_points(page, 0) == reward_points(page, 1) == 2
    assert "exported snapshot" in page.locator("#status").inner_text()
    assert all(url.startswith(("file:", "data:")) for url in requests), requests
    page.screenshot(path=str(artifacts / "export-metrics.png"), full_page=True)
    page.goto(out.as_uri() + "#trees")
    page.locator("#run-select").select_option("1")
    page.wait_for_selector(".node[data-depth='2']")
    page.screenshot(path=str(artifacts / "export-trees.png"), full_page=True)


def test_env_aware_rendering_and_budget_stops(tmp_path, serve, page, artifacts):
    sql = {**SAMPLE, "id": "sql1"}
    repl_root = {**SAMPLE, "id": "rlm1", "env_id": "rlm_repl", "messages": [
        {"role": "user", "content": "Find the answer."},
        {"role": "assistant", "content": "Let me ask.\n```repl\nx = rlm_query('CHILD: sub-question')\n"
                                         "y = rlm_query('CHILD: other')\nprint(x, y)\n```"},
        {"role": "user", "content": "Error: rlm_query refused: max_sub_calls=0 sub-calls per rollout are used up."}],
        "turns": [{"action": "...", "observation": [
            {"role": "user", "content": "Error: rlm_query refused: max_sub_calls=0 sub-calls per rollout are used up."}]}]}
    child = {**CHILD, "id": "rlmc", "parent_id": "rlm1", "env_id": "rlm_repl"}
    other = {**child, "id": "rlmd", "task": {"prompt": "CHILD: other"}}
    shell = {**SAMPLE, "id": "sh1", "env_id": "harbor_terminal", "messages": [
        {"role": "user", "content": "List files."}, {"role": "assistant", "content": "```bash\nls /app\n```\n<done/>"},
        {"role": "user", "content": "$ ls /app\nmain.py"}]}
    viewer = serve(write_run(tmp_path / "run", samples=[sql, repl_root, child, other, shell]))
    page.goto(viewer.url + "#samples")
    page.locator("#sample-list li[data-sample-id='sql1']").click()
    page.wait_for_selector("#sample-detail[data-sample-id='sql1']")
    assert page.locator("#sample-detail pre.lang-sql").inner_text() == "sql\nSELECT COUNT(*) FROM t"
    assert "count\n    3" in page.locator("#sample-detail pre.output").inner_text()  # the result table, aligned
    page.screenshot(path=str(artifacts / "sql-sample.png"), full_page=True)
    page.locator("#sample-list li[data-sample-id='sh1']").click()
    page.wait_for_selector("#sample-detail[data-sample-id='sh1']")
    assert page.locator("#sample-detail pre.lang-bash").inner_text() == "bash\nls /app"
    assert page.locator("#sample-detail pre.output").inner_text() == "$ ls /app\nmain.py"
    page.goto(viewer.url + "#trees")
    page.wait_for_selector("#tree-detail[data-sample-id='rlm1']")
    assert "budget stop: 1 refused" in page.locator(".node[data-node-id='rlm1']").inner_text()
    assert "budget: 1 sub-call(s) refused" in page.locator("#tree-detail").inner_text()
    call_sites = page.locator("#tree-detail pre.lang-repl a.call-site")
    assert call_sites.all_inner_texts() == ["rlm_query(", "rlm_query("]
    call_sites.nth(1).click()  # the call that wrote 'CHILD: other' highlights that child only
    assert [n.get_attribute("data-node-id") for n in page.locator(".node.flash").all()] == ["rlmd"]
    assert page.locator(".node[data-node-id='rlmc']").inner_text() == (
        "depth 1 · reward 0.5 · adv 0.7 · terminated\nprompt: CHILD: sub-question\n→ 3")


ODD_IDS = ["a(b)'c*d!e", "with space #1 %2F/x?y=z&w", "ünïcødé ✓ 😀", 'plain~-._"quoted"']


def open_sample(page, sample_id: str) -> None:
    """Click the sample's list entry and wait until its detail shows."""
    page.evaluate("""(id) => [...document.querySelectorAll('#sample-list li[data-sample-id]')]
        .find((li) => li.dataset.sampleId === id).click()""", sample_id)
    page.wait_for_function("(id) => document.getElementById('sample-detail').dataset.sampleId === id", arg=sample_id)


def test_sample_ids_with_odd_characters_open_in_the_page_and_in_the_export(tmp_path, serve, page, artifacts):
    samples = [{**SAMPLE, "id": sample_id, "messages": [{"role": "user", "content": f"Question {i}"}]}
               for i, sample_id in enumerate(ODD_IDS)]
    folder = write_run(tmp_path / "run", samples=samples)
    export = export_html([Run(folder)], tmp_path / "export.html")
    for url in (serve(folder).url + "#samples", export.as_uri() + "#samples"):
        page.goto(url)
        page.wait_for_selector("#sample-list li[data-sample-id]")
        for i, sample_id in enumerate(ODD_IDS):
            open_sample(page, sample_id)
            assert page.locator("#sample-detail h2").inner_text() == f"Question {i}"
    page.screenshot(path=str(artifacts / "odd-ids-export.png"), full_page=True)


def test_a_large_sample_is_cut_with_a_note_and_a_link_to_the_full_sample(tmp_path, serve, page, artifacts):
    sample = {**SAMPLE, "messages": [{"role": "user", "content": "Question"},
                                     {"role": "assistant", "content": "q" * 1_000_000}]}
    folder = write_run(tmp_path / "run", samples=[sample])
    page.goto(serve(folder).url + "#samples")
    page.wait_for_selector("#sample-detail[data-sample-id='root1']")
    note = page.locator("#sample-detail .notice.cut")
    assert "characters of its texts are not shown" in note.inner_text()
    assert "more characters cut]" in page.locator("#sample-detail .conversation").inner_text()
    page.screenshot(path=str(artifacts / "large-sample.png"))
    full = page.evaluate("""async () => (await (await fetch(document.querySelector('a.full-sample').href)).json())
        .sample.messages[1].content.length""")
    assert full == 1_000_000
    page.goto(export_html([Run(folder)], tmp_path / "export.html").as_uri() + "#samples")
    page.wait_for_selector("#sample-detail[data-sample-id='root1']")
    assert "The full sample is not in this export" in page.locator("#sample-detail .notice.cut").inner_text()
