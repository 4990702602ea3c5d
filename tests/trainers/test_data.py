"""Training tasks from the env's dataset or JSONL/Parquet files; every data error names file and row."""

import json

import pytest
from skyrl_core.data import DataError
from skyrl_reverse_text.env import ReverseTextConfig, ReverseTextEnv
from skyrl_trainers.data import TaskStream, load_training_tasks


def load(files=()):
    return load_training_tasks(ReverseTextEnv, ReverseTextConfig(dataset_size=5), list(files))


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_default_is_the_envs_builtin_dataset():
    tasks = load()
    assert len(tasks) == 5 and all("text" in t for t in tasks)


def test_jsonl_and_parquet_files_are_concatenated(tmp_path):
    import datasets

    jsonl = write_jsonl(tmp_path / "a.jsonl", [{"id": "a1", "text": "abc"}, {"id": "a2", "text": "de"}])
    parquet = tmp_path / "b.parquet"
    datasets.Dataset.from_list([{"id": "b1", "text": "xyz"}]).to_parquet(str(parquet))
    assert [t["id"] for t in load([jsonl, str(parquet)])] == ["a1", "a2", "b1"]


def test_invalid_json_names_the_row(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "ab"}, {"text": "cd"}, "{not json"])
    with pytest.raises(DataError, match=r"bad\.jsonl: row 3 is not valid JSON"):
        load([path])


def test_a_row_the_env_cannot_use_names_the_row_and_the_problem(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"text": "ab"}, {"text": ""}, {"text": "cd"}])
    with pytest.raises(DataError, match=r"tasks\.jsonl: row 2: not a valid ReverseTextEnv task: .*non-empty 'text'"):
        load([path])


def test_missing_or_unsupported_files_are_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load([str(tmp_path / "nope.jsonl")])
    (tmp_path / "tasks.csv").write_text("text\nab\n")
    with pytest.raises(DataError, match="unsupported task file type '.csv'"):
        load([str(tmp_path / "tasks.csv")])


def test_stream_reshuffles_each_epoch_and_resumes_at_its_position():
    tasks = [{"id": i} for i in range(5)]
    stream = TaskStream(tasks, seed=3)
    first = [t["id"] for t in stream.next_batch(5)]
    assert sorted(first) == list(range(5))
    stream.next_batch(2)
    state = stream.state_dict()
    expected = [t["id"] for t in stream.next_batch(6)]
    resumed = TaskStream(tasks, seed=3)
    resumed.load_state_dict(state)
    assert [t["id"] for t in resumed.next_batch(6)] == expected


def test_stream_refuses_a_different_dataset_on_resume():
    state = TaskStream([{"id": 1}, {"id": 2}]).state_dict()
    with pytest.raises(DataError, match="2 tasks but the dataset now has 3"):
        TaskStream([{"id": 1}, {"id": 2}, {"id": 3}]).load_state_dict(state)
