"""The run folder: checkpoint markers and what a resume drops."""

import json

import pytest
from skyrl_core.factory import ConfigError
from skyrl_core.trajectory import Trajectory, TrajectoryBatch, write_jsonl
from skyrl_trainers.run_folder import RunFolder


def test_forget_after_drops_what_an_interrupted_run_logged_past_its_checkpoint(tmp_path):
    folder = RunFolder(tmp_path)
    folder.metrics.write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(1, 5)))
    write_jsonl(folder.samples, [Trajectory(id=f"t{s}", metrics={"train_step": float(s)}) for s in range(1, 5)])
    folder.forget_after(2)
    assert [json.loads(line)["step"] for line in folder.metrics.read_text().splitlines()] == [1, 2]
    assert [t.id for t in TrajectoryBatch.from_jsonl(folder.samples)] == ["t1", "t2"]


def test_latest_checkpoint_is_the_committed_one(tmp_path):
    folder = RunFolder(tmp_path)
    folder.create({"trainer": {"id": "fsdp_grpo"}})
    for step in (2, 4):
        (folder.new_checkpoint(step) / "trainer_state.pt").write_bytes(b"x")
        folder.commit_checkpoint(step)
    folder.new_checkpoint(6)  # a save that was interrupted before its commit
    assert folder.latest_checkpoint().name == "step_000004"


def test_resume_without_a_checkpoint_or_into_another_run_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        RunFolder(tmp_path / "empty").latest_checkpoint()
    folder = RunFolder(tmp_path / "run")
    folder.create({})
    with pytest.raises(ConfigError, match="already holds a run"):
        RunFolder(tmp_path / "run").create({})
    RunFolder(tmp_path / "run").create({}, resuming=True)


def test_undo_create_removes_a_new_folder_and_restores_a_resumed_runs_config(tmp_path):
    fresh = RunFolder(tmp_path / "new")
    fresh.create({"trainer": {"id": "fsdp_grpo"}})
    fresh.undo_create(fresh=True, previous_config=None)
    assert not fresh.path.exists()
    resumed = RunFolder(tmp_path / "old")
    resumed.create({"trainer": {"model": "tiny-random"}})
    before = resumed.saved_config()
    resumed.create({"trainer": {"model": "other"}}, resuming=True)
    resumed.undo_create(fresh=False, previous_config=before)
    assert resumed.saved_config() == before and resumed.checkpoints.is_dir()
