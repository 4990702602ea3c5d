"""``skyrl eval``: the per-sample table, pass@k on known answers, the results folder, env run_defaults.

Every test runs the real ``skyrl`` CLI in a subprocess on a real env. Known answers come from the engine
``answers`` (``eval_engines.py``): reverse_text answered right a given number of times per task.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from math import comb
from pathlib import Path

import pytest
import yaml
from skyrl_core.eval_report import prompt_tail
from skyrl_core.eval_scores import pass_at_k, pass_ks
from skyrl_core.trajectory import read_jsonl

HERE = Path(__file__).parent
SKYRL = Path(sys.executable).with_name("skyrl")
WIDE = "500"  # columns: table cells never wrap, so their text can be looked for in the output


def skyrl_eval(*args: str, cwd: Path, columns: str = WIDE) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": columns, "SKYRL_PLUGIN_MODULES": "eval_engines",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(SKYRL), "eval", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def right(counts: dict[str, int]) -> str:
    return "engine.right={" + ", ".join(f"{text}: {n}" for text, n in counts.items()) + "}"


def test_pass_at_k_is_the_unbiased_estimate():
    for n, c, k in itertools.product(range(1, 7), range(0, 7), range(1, 7)):
        if c > n or k > n:
            continue
        draws = list(itertools.combinations([True] * c + [False] * (n - c), k))  # every k of the n samples
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws)), (n, c, k)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - comb(2, 2) / comb(4, 2)) == pytest.approx(5 / 6)
    assert [pass_ks(n) for n in (1, 2, 3, 4, 5, 8)] == [[1], [1, 2], [1, 2, 3], [1, 2, 4], [1, 2, 4, 5], [1, 2, 4, 8]]
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_eval_prints_the_first_episodes_and_writes_a_results_folder(tmp_path):
    from skyrl_reverse_text.env import ReverseTextEnv

    rows = ReverseTextEnv.load_dataset("test")[:3]  # the env's own split, as `skyrl eval` reads it
    done = skyrl_eval("--env", "reverse_text", "--engine", "answers", "--n-tasks", "3", "--show", "2",
                      "env.max_turns=1", right({rows[0]["text"]: 1}), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "first 2 of 3 episodes" in out
    assert rows[0]["id"] in out and rows[1]["id"] in out and rows[2]["id"] not in out
    assert f"<answer>{rows[0]['text'][::-1]}</answer>" in out  # the completion
    assert rows[0]["text"] in out  # the end of the prompt: the text to reverse
    assert "terminated" in out and "truncated (turn limit (1) reached)" in out  # how each episode ended
    assert "per task" not in out  # one episode per task: no pass@k table
    assert "eval summary" in out and "eval/pass@1" in out and "reward/mean" in out

    (folder,) = (tmp_path / "evals").iterdir()  # evals/<env>-<model>-<timestamp>
    assert folder.name.startswith("reverse_text-chatml-")
    assert f"wrote the evaluation to {Path('evals') / folder.name}" in out
    info = json.loads((folder / "eval.json").read_text())
    assert {k: info[k] for k in ("env", "model", "engine", "generator", "split", "tasks", "samples_per_task")} == {
        "env": "reverse_text", "model": "chatml", "engine": "answers", "generator": "default", "split": "test",
        "tasks": 3, "samples_per_task": 1}
    assert info["pass_threshold"] == 1.0 and info["reward_range"] == [0.0, 1.0]
    assert {"python", "skyrl-core", "skyrl-reverse-text"} <= set(info["versions"])
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["env"] == {**config["env"], "id": "reverse_text", "max_turns": 1}
    assert config["engine"]["id"] == "answers" and "trainer" not in config
    episodes = list(read_jsonl(folder / "samples.jsonl"))  # a run folder's samples format
    assert [(t.group_id, t.reward) for t in episodes] == [
        (rows[0]["id"], 1.0), *((row["id"], pytest.approx(0.5 * (len(row["text"]) - 1) / len(row["text"])))
                                for row in rows[1:])]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["eval/pass@1"] == pytest.approx(1 / 3) and metrics["reward/mean"] == pytest.approx(
        sum(t.reward for t in episodes) / 3)
    per_task = json.loads((folder / "per_task.json").read_text())
    assert [(r["task"], r["n"], r["passed"]) for r in per_task["tasks"]] == [
        (rows[0]["id"], 1, 1), (rows[1]["id"], 1, 0), (rows[2]["id"], 1, 0)]

    again = skyrl_eval("--env", "reverse_text", "--engine", "answers", "--out", str(folder), cwd=tmp_path)
    assert again.returncode == 2 and "already holds results" in again.stderr


def test_eval_tables_fit_an_80_column_terminal(tmp_path):
    done = skyrl_eval("--env", "reverse_text", "--engine", "answers", "--n-tasks", "2", "--samples-per-task", "2",
                      "--show", "2", "env.max_turns=1", cwd=tmp_path, columns="80")
    assert done.returncode == 0, done.stdout + done.stderr
    tables = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert tables and max(len(line) for line in tables) <= 80, "\n".join(tables)
    assert "first 2 of 4 episodes" in done.stdout and "per task" in done.stdout and "eval summary" in done.stdout


TASKS = {"t-one": ("apple", 1), "t-two": ("river", 2), "t-none": ("stone", 0), "t-all": ("cloud", 4)}
WRONG = 0.5 * 4 / 5  # a five-letter text answered with its last character wrong


def test_pass_at_k_on_a_scripted_engine_with_known_answers(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": task, "text": text}) + "\n" for task, (text, _) in TASKS.items()))
    counts = {text: c for text, c in TASKS.values()}
    done = skyrl_eval("--env", "reverse_text", "--engine", "answers", "--tasks", str(tasks), "--samples-per-task", "4",
                      "--out", str(tmp_path / "out"), "env.max_turns=1", right(counts), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # by hand, n = 4 samples, c passing: pass@1 = c/4, pass@2 = 1 - C(4-c, 2)/C(4, 2) with C(4, 2) = 6,
    # pass@4 = 1 unless c = 0; mean@4 = (c * 1 + (4 - c) * WRONG) / 4
    expected = {"t-one": (1 / 4, 1 - 3 / 6, 1.0), "t-two": (2 / 4, 1 - 1 / 6, 1.0), "t-none": (0.0, 0.0, 0.0),
                "t-all": (1.0, 1.0, 1.0)}
    per_task = json.loads((tmp_path / "out" / "per_task.json").read_text())
    assert per_task["pass_ks"] == [1, 2, 4] and per_task["pass_threshold"] == 1.0
    rows = {row["task"]: row for row in per_task["tasks"]}
    for task, (p1, p2, p4) in expected.items():
        c = TASKS[task][1]
        row = rows[task]
        assert (row["n"], row["passed"]) == (4, c)
        assert (row["pass@1"], row["pass@2"], row["pass@4"]) == (pytest.approx(p1), pytest.approx(p2), pytest.approx(p4))
        assert row["mean@4"] == pytest.approx((c + (4 - c) * WRONG) / 4)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    for k, column in ((1, 0), (2, 1), (4, 2)):
        assert metrics[f"eval/pass@{k}"] == pytest.approx(sum(v[column] for v in expected.values()) / 4)
    out = done.stdout
    assert "per task (passing: reward >= 1)" in out and "pass@2" in out and "mean@4" in out
    assert "0.8333" in out  # t-two's pass@2 in the per-task table

    lenient = skyrl_eval("--env", "reverse_text", "--engine", "answers", "--tasks", str(tasks), "--samples-per-task",
                         "2", "--pass-threshold", str(WRONG), "--out", str(tmp_path / "lenient"), "--show", "0",
                         "env.max_turns=1", right(counts), cwd=tmp_path)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "first" not in lenient.stdout  # --show 0: no per-sample table
    metrics = json.loads((tmp_path / "lenient" / "metrics.json").read_text())
    assert metrics["eval/pass@1"] == 1.0 and metrics["eval/pass@2"] == 1.0  # every answer reaches the threshold


def test_eval_rlm_repl_on_tiny_random_uses_the_envs_run_defaults(tmp_path):
    pytest.importorskip("skyrl_trainers")
    pytest.importorskip("skyrl_rlm_repl")
    out = tmp_path / "out"
    done = subprocess.run([str(SKYRL), "eval", "--env", "rlm_repl", "--model", "tiny-random", "--n-tasks", "1",
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": WIDE})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from skyrl_core.held_out import default_split
    from skyrl_core.plugins import get_registry
    from skyrl_rlm_repl.starter import STARTER_SPLITS

    split, _ = default_split([{"env": {"id": "rlm_repl"}}], get_registry())  # what a run evaluates on
    assert split in STARTER_SPLITS  # short tasks, not the long evidence split
    info = json.loads((out / "eval.json").read_text())
    assert (info["split"], info["engine"], info["model"], info["generator"]) == (split, "hf", "tiny-random", "rlm_tree")
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["env"]["max_turns"] == 2 and config["generator"]["max_tokens_per_turn"] == 64  # run_defaults
    roots = [t for t in read_jsonl(out / "samples.jsonl") if t.parent_id is None]
    assert len(roots) == 1 and roots[0].error is None and roots[0].task["split"] == split
    # the worked example (run_defaults) puts an assistant message in the prompt: the table still shows the task
    assert roots[0].messages[2]["role"] == "assistant" and roots[0].task["question"] in prompt_tail(roots[0])
