"""Forgeable tasks (tests that run what the agent wrote, as root) are left out of training by default, played and
marked by `skyrl eval` and `skyrl rollout`, and included on request; a forging policy earns nothing from them
under the training defaults."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
from harbor_helpers import play
from skyrl_harbor_terminal.config import HarborTerminalConfig
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_harbor_terminal.forgeable import ForgeableDatasetError
from skyrl_harbor_terminal.task import HarborTaskWarning

FORGED = Path(__file__).parent / "tasks" / "forged-greet"
CLEAN = Path(__file__).parent / "tasks" / "python-substitute"
# greet.sh as a forger writes it: as root in the tests, it writes reward 1 and kills the test script before it
# can write its own verdict.
FORGE = ("```bash\nprintf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\nkill -9 $PPID\\n' > /app/greet.sh\n"
         "chmod +x /app/greet.sh\n```\n<done/>")


def dataset(tmp_path: Path, *names: Path) -> Path:
    root = tmp_path / "tasks"
    root.mkdir()
    for task in names:
        shutil.copytree(task, root / task.name)
    return root


def rows(tasks: Path, split: str, **options: str) -> tuple[list[dict], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HarborTaskWarning)
        found = HarborTerminalEnv.load_dataset(split, HarborTerminalConfig(tasks=str(tasks), **options))
    return list(found), [str(w.message) for w in caught if "forgeable_tasks" in str(w.message)]


def test_training_leaves_forgeable_tasks_out_with_one_line_naming_them(tmp_path: Path) -> None:
    tasks = dataset(tmp_path, FORGED, CLEAN)
    kept, said = rows(tasks, "train")
    assert [row["task_path"] for row in kept] == [str(tasks / CLEAN.name)]
    (line,) = said
    assert "left out of split 'train'" in line and "test/forged-greet (steps/polish/tests/test.sh:4: agent-code)" in line
    assert "env.forgeable_tasks=include" in line and "tests_run_agent_code" in line


def test_include_plays_them_marked_on_every_split(tmp_path: Path) -> None:
    tasks = dataset(tmp_path, FORGED, CLEAN)
    for split in ("train", "test"):
        kept, (line,) = rows(tasks, split, forgeable_tasks="include")
        forged = next(row for row in kept if row["task_path"].endswith("forged-greet"))
        assert forged["name"] == "test/forged-greet [forgeable]" and "agent-code" in forged["forgeable"]
        assert "marked [forgeable]" in line and len(kept) == 2
    kept, _ = rows(tasks, "test")
    assert len(kept) == 1


def test_run_skips_them_and_eval_and_rollout_include_them_by_default(skyrl_cli, tmp_path: Path, monkeypatch) -> None:
    import yaml

    monkeypatch.chdir(tmp_path)
    chosen = {}
    for command in ("run", "eval", "rollout"):
        result = skyrl_cli(command, "--env", "harbor_terminal", "--print-config")
        assert result.exit_code == 0, result.output
        chosen[command] = yaml.safe_load(result.stdout)["env"]["forgeable_tasks"]
    assert chosen == {"run": "skip", "eval": "include", "rollout": "include"}
    result = skyrl_cli("eval", "--env", "harbor_terminal", "--print-config", "env.forgeable_tasks=skip")
    assert yaml.safe_load(result.stdout)["env"]["forgeable_tasks"] == "skip"  # an explicit choice wins


def test_a_dataset_of_only_forgeable_tasks_says_so(tmp_path: Path) -> None:
    tasks = dataset(tmp_path, FORGED)
    with pytest.raises(ForgeableDatasetError, match=r"every task of split 'train' \(1\) is left out as forgeable"):
        rows(tasks, "train")


@pytest.mark.slow  # builds a small image, plays two episodes
def test_a_forging_policy_scores_only_where_the_task_is_included(tmp_path: Path, docker_backend: str) -> None:
    tasks = dataset(tmp_path, FORGED, CLEAN)
    options = {"backend": docker_backend, "max_turns": 2, "build_logs": str(tmp_path / "logs")}
    trained, _ = rows(tasks, "train")
    assert all(not row["task_path"].endswith("forged-greet") for row in trained)  # no episode of it is trained on
    (included,) = [row for row in rows(tasks, "train", forgeable_tasks="include")[0] if "forgeable" in row]
    results, _ = play(included, [FORGE, FORGE], forgeable_tasks="include", **options)
    assert sum(result.reward for result in results) == 1.0  # the forgery works: this is why it is left out
    assert "error" not in results[-1].info
    unmarked = {key: value for key, value in included.items() if key != "forgeable"}  # as a task file gives it
    results, _ = play(unmarked, [FORGE], **options)
    assert results[-1].reward == 0.0 and "is forgeable" in results[-1].info["error"]
