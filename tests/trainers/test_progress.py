"""The console lines of a training run: each step's and each evaluation's line arrives whole."""

from __future__ import annotations

from skyrl_trainers.progress import TrainingProgress

STEP = {"reward/mean": 0.05, "train/loss": 0.0057, "train/kl": 0.0, "train/grad_norm": 1.8, "time/step_seconds": 71.0}


def test_step_and_eval_lines_are_not_broken_at_the_consoles_width(monkeypatch, capsys):
    # a narrow terminal, or output sent to a file (rich then assumes 80 columns): the terminal may wrap a
    # long line, but the line itself stays one line, so it greps and reads back whole from a log
    monkeypatch.setenv("COLUMNS", "40")
    with TrainingProgress(total=2) as progress:
        progress.evaluated(0, {"eval/reward_mean": 0.0375, "eval/pass_rate": 0.0}, "8 task(s) of split 'starter_test'")
        progress.step_done(1, STEP)
        progress.evaluated(1, {"eval/reward_mean": 0.25, "eval/pass_rate": 0.125}, "8 task(s) of split 'starter_test'")
        progress.step_done(2, STEP, note="step 2 had no learning signal: every group's rewards were equal")
    lines = capsys.readouterr().err.splitlines()
    assert "eval before training  reward 0.0375  pass rate 0  (8 task(s) of split 'starter_test')" in lines
    assert "step 1  reward 0.05  loss 0.0057  kl 0  grad 1.8  s 71" in lines
    assert "eval after step 1  reward 0.25  pass rate 0.125  (8 task(s) of split 'starter_test')" in lines
    assert "step 2 had no learning signal: every group's rewards were equal" in lines
