"""Held-out evaluation during training (trainer.eval_*): eval/* at step 0 and at the end, in every mode, from
the same tasks and seeds each time, without changing what the run trains; and the summary line of `skyrl run`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from skyrl_core.data import DataError
from skyrl_trainers.evaluation import HeldOutEval, spread
from skyrl_trainers.trainer import FSDPGRPOTrainer
from trainer_support import read_metrics

SKYRL = Path(sys.executable).with_name("skyrl")
TRAINED = ("reward/mean", "rollout/response_tokens_mean", "train/loss", "train/grad_norm")


def rows(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def eval_steps(run_dir):
    return [r["step"] for r in rows(run_dir) if "eval/reward_mean" in r]


def test_eval_tasks_are_spread_over_the_split():
    tasks = [{"id": i} for i in range(60)]
    assert [t["id"] for t in spread(tasks, 8)] == [0, 7, 15, 22, 30, 37, 45, 52]
    assert spread(tasks[:3], 8) == tasks[:3]


def test_a_run_evaluates_before_training_and_after_its_last_step_without_changing_the_training(run_config,
                                                                                              extra_envs, tmp_path):
    trainer = {"steps": 3, "export": False, "lr": 2e-2}
    off = run_config(env="letter_e", trainer=trainer, run={"output_dir": str(tmp_path / "off")})
    FSDPGRPOTrainer(off).fit()
    on = run_config(env="letter_e", trainer={**trainer, "eval_samples": 3}, run={"output_dir": str(tmp_path / "on")})
    summary = FSDPGRPOTrainer(on).fit()

    records = rows(tmp_path / "on")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert {k for k in records[0] if k not in ("step", "time")} == {k for k in records[0] if k.startswith("eval/")}
    assert eval_steps(tmp_path / "on") == [0, 3]
    for record in (records[0], records[3]):
        assert record["eval/tasks"] == 3.0 and record["eval/episodes"] == 3.0  # one episode per task
        assert 0.0 <= record["eval/pass_rate"] <= 1.0 and record["eval/errors"] == 0.0
    assert summary["eval/step_first"] == 0.0 and summary["eval/step_last"] == 3.0
    assert summary["eval/reward_mean_first"] == records[0]["eval/reward_mean"]
    assert summary["eval/reward_mean_last"] == records[3]["eval/reward_mean"]
    # evaluation draws no task and no random number of the run's: it trains exactly as with evaluation off
    trained = [r for r in records if r["step"] > 0]
    for key in TRAINED:
        assert [r[key] for r in trained] == [r[key] for r in read_metrics(tmp_path / "off")], key
    assert "eval/reward_mean" not in rows(tmp_path / "off")[-1]


def test_eval_every_adds_evaluations_and_the_seed_makes_them_repeat(run_config, extra_envs, tmp_path):
    def evaluations(name, **trainer):
        cfg = run_config(env="letter_e", trainer={"steps": 2, "export": False, "eval_samples": 2, **trainer},
                         run={"output_dir": str(tmp_path / name)})
        FSDPGRPOTrainer(cfg).fit()
        return [(r["step"], r["eval/reward_mean"]) for r in rows(tmp_path / name) if "eval/reward_mean" in r]

    every = evaluations("every", eval_every=1)
    assert [step for step, _ in every] == [0, 1, 2]
    # the same tasks, seeds and initial weights: the step-0 evaluation repeats to the last digit
    assert evaluations("again")[0] == every[0]


def test_eval_episodes_play_one_sample_per_task_at_the_eval_temperature(run_config):
    from skyrl_reverse_text.env import ReverseTextEnv

    cfg = run_config(generator={"temperature": 0.7}, trainer={"eval_samples": 3, "eval_temperature": 0.0})
    held_out = HeldOutEval(cfg, ReverseTextEnv)
    assert held_out.split == "test" and [t["id"] for t in held_out.tasks] == ["test-0", "test-21", "test-42"]
    assert held_out.generator_config.temperature == 0.0 and held_out.generator_config.n_samples_per_prompt == 1
    assert cfg.generator.temperature == 0.7  # the run's own generator is left as it is
    assert [held_out.due(step) for step in range(4)] == [True, False, True, False]  # steps: 2 (SMALL_RUN)


def test_a_resumed_run_keeps_its_step_0_evaluation_for_the_summary(run_config, extra_envs, tmp_path):
    trainer = {"export": False, "eval_samples": 2, "checkpoint_every": 1}
    FSDPGRPOTrainer(run_config(env="letter_e", trainer={**trainer, "steps": 2})).fit()
    run_dir = tmp_path / "run"
    summary = FSDPGRPOTrainer(run_config(env="letter_e", trainer={**trainer, "steps": 3},
                                         run={"resume": str(run_dir)})).fit()
    assert eval_steps(run_dir) == [0, 2, 3]  # the first part's end, then the resumed run's
    assert summary["eval/step_first"] == 0.0 and summary["eval/step_last"] == 3.0
    assert summary["eval/reward_mean_first"] == rows(run_dir)[0]["eval/reward_mean"]


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_overlapped_modes_evaluate_at_step_0_and_at_the_end(run_config, extra_envs, tmp_path, mode):
    cfg = run_config(env="letter_e", trainer={"steps": 2, "mode": mode, "off_policy": {"tis": "token"},
                                              "export": False, "eval_samples": 2})
    summary = FSDPGRPOTrainer(cfg).fit()
    run_dir = cfg.run.output_dir
    assert eval_steps(run_dir) == [0, 2]
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert summary["eval/step_first"] == 0.0 and summary["eval/step_last"] == 2.0


def test_a_run_on_task_files_evaluates_only_on_held_out_tasks_it_names(run_config, tmp_path, caplog):
    from skyrl_reverse_text.env import ReverseTextEnv

    files = tmp_path / "tasks.jsonl"
    files.write_text(json.dumps({"id": "mine", "text": "abc"}) + "\n")
    with caplog.at_level("WARNING", logger="skyrl_trainers.evaluation"):
        held_out = HeldOutEval(run_config(trainer={"eval_samples": 2, "train_files": [str(files)]}), ReverseTextEnv)
    assert not held_out.tasks and not held_out.due(0)
    assert "held-out evaluation is off: the run trains on trainer.train_files" in caplog.text
    named = HeldOutEval(run_config(trainer={"eval_samples": 2, "train_files": [str(files)], "eval_files": [str(files)]}),
                        ReverseTextEnv)
    assert [t["id"] for t in named.tasks] == ["mine"] and named.about == f"1 task(s) of {files}"


def test_an_eval_split_that_cannot_load_names_the_option_before_any_model_loads(run_config, tmp_path):
    missing = tmp_path / "held_out.jsonl"
    cfg = run_config(trainer={"eval_files": [str(missing)], "eval_samples": 2})
    with pytest.raises(DataError, match=r"held-out evaluation \(trainer.eval_files\): task file .*held_out.jsonl"
                                        r".* does not exist.*trainer.eval_samples=0"):
        FSDPGRPOTrainer(cfg).fit()
    assert not (Path(cfg.run.output_dir) / "metrics.jsonl").exists()


def test_skyrl_run_reports_the_eval_reward_before_and_after_training(tmp_path):
    run_dir = tmp_path / "run"
    command = [str(SKYRL), "run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--model", "tiny-random",
               "trainer.steps=3", "trainer.batch_size=1", "trainer.eval_samples=2", "trainer.export=false",
               "generator.n_samples_per_prompt=2", "generator.max_tokens_per_turn=6", "generator.max_total_tokens=12",
               f"run.output_dir={run_dir}", "run.console=false"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = rows(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert eval_steps(run_dir) == [0, 3]
    first, last = records[0]["eval/reward_mean"], records[3]["eval/reward_mean"]
    line = re.search(r"eval reward: (\d+\.\d{3}) -> (\d+\.\d{3}) \(step 0 -> step 3\); pass rate: \d\.\d{3} -> "
                     r"\d\.\d{3}", done.stdout)
    assert line, done.stdout[-3000:]
    assert (line.group(1), line.group(2)) == (f"{first:.3f}", f"{last:.3f}")
    assert "eval/reward_mean_first" in done.stdout  # the summary table too
