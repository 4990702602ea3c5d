"""``skyrl check ENV --dataset PATH``: every task's oracle, one table row each, on a dataset the user names."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from skyrl_core import EnvConfig, EnvSpec, StepResult, TextEnv, hookimpl


class FolderConfig(EnvConfig):
    questions: str | None = Field(None, description="A folder of <name>.txt files, each 'a b'.")


class FolderEnv(TextEnv):
    """Tasks are files of a folder (the env's dataset option); the answer is a + b. A file named ``broken-*``
    has a wrong gold answer; one named ``fails-*`` breaks the env. Each episode reports its file's size."""

    config_class: ClassVar[type[EnvConfig]] = FolderConfig
    dataset_option: ClassVar[str] = "questions"

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        folder = Path(config.questions)
        warnings.warn(f"{folder}: read as a dataset of questions", UserWarning, stacklevel=2)
        return [{"name": path.stem, "path": str(path)} for path in sorted(folder.glob("*.txt"))]

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": Path(self.task["path"]).read_text()}]

    def take_action(self, action: str) -> StepResult:
        if self.task["name"].startswith("fails-"):
            return StepResult([], 0.0, False, True, {"error": "the machine would not start", "report": {"size": "?"}})
        a, b = map(int, Path(self.task["path"]).read_text().split())
        report = {"size": f"{Path(self.task['path']).stat().st_size} B"}
        return StepResult([], float(action == str(a + b)), True, False, {"report": report})

    def gold_actions(self) -> list[str]:
        a, b = map(int, Path(self.task["path"]).read_text().split())
        return [str(a + b + (1 if self.task["name"].startswith("broken-") else 0))]


class ArithmeticEnv(TextEnv):
    def take_action(self, action: str) -> StepResult:
        return StepResult([], float(action == self.task["answer"]), True, False, {})

    def gold_actions(self) -> list[str]:
        return [self.task["answer"]]


class Plugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="folder_qa", entry_point="test_core_dataset_report:FolderEnv", description="folder"))
        register(EnvSpec(id="rows_qa", entry_point="test_core_dataset_report:ArithmeticEnv", description="rows"))


def _folder(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "questions"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.txt").write_text(text)
    return folder


def test_the_report_names_each_task_with_the_env_columns_and_fails_on_a_broken_one(skyrl_cli, register_skyrl_plugin,
                                                                                    tmp_path):
    register_skyrl_plugin(Plugin())
    folder = _folder(tmp_path, {"add": "2 3", "broken-sum": "1 1", "fails-start": "4 4"})
    result = skyrl_cli("check", "folder_qa", "--dataset", str(folder), env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert f"WARN  {folder}: read as a dataset of questions" in result.output  # the loader's warnings, once
    header = next(line for line in result.output.splitlines() if "oracle reward" in line)
    assert [word in header for word in ("task", "size", "end", "problem")] == [True] * 4
    add = next(line for line in result.output.splitlines() if "│ add " in line)
    assert "3 B" in add and "terminated" in add
    assert "broken-sum: the gold actions scored 0, expected the top of reward_range 1" in result.output
    assert "fails-start: error: the machine would not start" in result.output
    assert "1 of 3 task(s) solved by their oracle at reward 1; failed: broken-sum, fails-start" in result.output


def test_the_report_table_fits_the_terminal(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(Plugin())
    folder = _folder(tmp_path, {"add": "2 3", "broken-sum": "1 1"})
    result = skyrl_cli("check", "folder_qa", "--dataset", str(folder), env={"COLUMNS": "80"})
    assert result.exit_code == 1, result.output
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80, "\n".join(table)
    assert "broken-sum: the gold actions scored 0, expected the top of reward_range 1" in result.output


def test_the_report_as_json_and_a_clean_dataset_passes(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(Plugin())
    folder = _folder(tmp_path, {"one": "1 2", "two": "20 22"})
    result = skyrl_cli("check", "folder_qa", "--dataset", str(folder), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert (report["tasks"], report["failed"]) == (2, 0)
    assert report["rows"][1] == {"task": "two", "size": "5 B", "oracle reward": 1.0, "end": "terminated",
                                 "problem": ""}


def test_an_env_without_a_dataset_option_takes_jsonl_rows_and_refuses_a_folder(skyrl_cli, register_skyrl_plugin,
                                                                               tmp_path):
    register_skyrl_plugin(Plugin())
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"name": "a", "prompt": "1+1", "answer": "2"}) + "\n")
    result = skyrl_cli("check", "rows_qa", "--dataset", str(rows))
    assert result.exit_code == 0, result.output
    assert "1 of 1 task(s) solved by their oracle" in result.output
    refused = skyrl_cli("check", "rows_qa", "--dataset", str(tmp_path))
    assert refused.exit_code != 0
    assert "reads no dataset path (it declares no dataset_option)" in refused.output
    empty = skyrl_cli("check", "folder_qa", "--dataset", str(_folder(tmp_path, {})))
    assert empty.exit_code != 0 and "no tasks in this dataset" in empty.output


def test_a_row_has_one_number_in_every_message(skyrl_cli, register_skyrl_plugin, tmp_path):
    """Rows count from 1: a file error, the --dataset table and the oracle all call the second row 'row 2'."""
    register_skyrl_plugin(Plugin())
    rows = tmp_path / "rows.jsonl"
    good = json.dumps({"prompt": "1+1", "answer": "2"})
    rows.write_text(good + "\n" + json.dumps({"prompt": "2+2", "answer": "4"}) + "\n")
    table = skyrl_cli("check", "rows_qa", "--dataset", str(rows), "--json")
    assert [row["task"] for row in json.loads(table.output[table.output.index("{"):])["rows"]] == ["row 1", "row 2"]
    oracle = skyrl_cli("rollout", "--env", "rows_qa", "--oracle", "--tasks", str(rows), "--out", str(tmp_path / "o.jsonl"))
    assert oracle.exit_code == 0 and "oracle solved all 2 task(s)" in oracle.output
    rows.write_text(good + "\n[1, 2]\n")
    broken = skyrl_cli("check", "rows_qa", "--dataset", str(rows))
    assert broken.exit_code != 0 and "rows.jsonl: row 2 must be a JSON object" in broken.output
    rows.write_text(good + "\n\n[1, 2]\n")  # a blank line: the row number stays, the file line is added
    broken = skyrl_cli("check", "rows_qa", "--dataset", str(rows))
    assert "rows.jsonl: row 2 (line 3) must be a JSON object" in broken.output
