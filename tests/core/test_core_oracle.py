"""Oracle episodes: ``play_gold``, ``skyrl rollout --oracle`` and the named gold checks of ``skyrl check``."""

from __future__ import annotations

import asyncio
import json
import operator
from typing import Any

import pytest
from skyrl_core import EnvSpec, StepResult, TextEnv, hookimpl
from skyrl_core.oracle import OracleResult, play_gold, task_name
from skyrl_core.testing import EnvCheckError, check_env

OPS = {"+": operator.add, "*": operator.mul, "-": operator.sub}
ROWS = [
    {"name": "add", "a": 2, "b": 3, "op": "+"},
    {"name": "mul", "a": 4, "b": 5, "op": "*"},
    {"name": "broken-task", "a": 6, "b": 7, "op": "*", "gold": "41"},  # its gold answer is wrong
]
CLOSED: list[str] = []  # task names of every env closed, in order


class ArithmeticEnv(TextEnv):
    """One question; reward 1 for the right number. Its gold action is the answer (or the row's ``gold``)."""

    def build_prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"What is {self.task['a']} {self.task['op']} {self.task['b']}?"}]

    def answer(self) -> str:
        return str(OPS[self.task["op"]](self.task["a"], self.task["b"]))

    def take_action(self, action: str) -> StepResult:
        if action.strip() == self.answer():
            return StepResult([], 1.0, True, False, {})
        return StepResult([{"role": "user", "content": f"{action[:20]!r} is wrong."}], 0.0, True, False, {})

    def gold_actions(self) -> list[str]:
        return [self.task.get("gold", self.answer())]

    def get_metrics(self) -> dict[str, float]:
        return {"operands": 2.0}

    def close(self) -> None:
        CLOSED.append(task_name(self.task, -1))

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [dict(row) for row in ROWS]


class FlakyEnv(ArithmeticEnv):
    """Fails on purpose where a row asks: in take_action, in reset, in gold_actions, or has no gold."""

    def build_prompt(self) -> list[dict[str, str]]:
        if self.task.get("fail") == "reset":
            raise ConnectionError("container did not start")
        return super().build_prompt()

    def take_action(self, action: str) -> StepResult:
        if self.task.get("fail") == "step":
            raise RuntimeError("calculator on fire")
        return super().take_action(action)

    def gold_actions(self) -> list[str] | None:
        if self.task.get("fail") == "gold":
            raise FileNotFoundError("solve.sh")
        if self.task.get("fail") == "no_gold":
            return None
        return super().gold_actions()

    @classmethod
    def load_dataset(cls, split: str = "train", config: Any = None) -> list[dict[str, Any]]:
        return [dict(ROWS[0]), {"name": "explodes", "a": 1, "b": 1, "op": "-", "fail": "step"}, dict(ROWS[1])]


class MeetingEnv(ArithmeticEnv):
    """Async: each action waits at a shared barrier, so it only finishes when episodes overlap."""

    barrier: asyncio.Barrier | None = None
    active = 0
    most_active = 0

    async def atake_action(self, action: str) -> StepResult:
        cls = type(self)
        cls.active += 1
        cls.most_active = max(cls.most_active, cls.active)
        try:
            if cls.barrier is not None:
                await asyncio.wait_for(cls.barrier.wait(), timeout=5)
            await asyncio.sleep(0.01)
        finally:
            cls.active -= 1
        return self.take_action(action)


class OracleEnvsPlugin:
    @hookimpl
    def register_envs(self, register):
        register(EnvSpec(id="arith", entry_point="test_core_oracle:ArithmeticEnv", description="arithmetic"))
        register(EnvSpec(id="arith_flaky", entry_point="test_core_oracle:FlakyEnv", description="fails on purpose"))


@pytest.fixture(autouse=True)
def _fresh_state():
    CLOSED.clear()
    MeetingEnv.barrier, MeetingEnv.active, MeetingEnv.most_active = None, 0, 0
    yield


def _read_jsonl(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- play_gold ----------------------------------------------------------------------------------


def test_task_name_prefers_name_then_id_then_task_id_then_the_index():
    assert task_name({"name": "n", "id": "i", "task_id": "t"}, 3) == "n"
    assert task_name({"id": 7, "task_id": "t"}, 3) == "7"
    assert task_name({"task_id": "t", "name": ""}, 3) == "t"
    assert task_name({"question": "?"}, 3) == "row 4"  # 1-based, like every message about a row


def test_play_gold_scores_each_row_in_row_order_with_a_sync_env():
    results = asyncio.run(play_gold(ArithmeticEnv, {}, ROWS))
    assert [r.task_name for r in results] == ["add", "mul", "broken-task"]
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.reward for r in results] == [1.0, 1.0, 0.0]
    assert all(r.terminated and not r.truncated and r.turns == 1 and r.error is None for r in results)
    assert results[0].metrics == {"operands": 2.0}
    assert [r.problem(ArithmeticEnv.reward_range) for r in results[:2]] == [None, None]
    assert results[2].problem((0.0, 1.0)) == "the gold actions scored 0, expected the top of reward_range 1"


def test_play_gold_records_every_failure_and_closes_every_env():
    rows = [{"name": "ok", "a": 1, "b": 2, "op": "+"},
            {"name": "step", "a": 1, "b": 2, "op": "+", "fail": "step"},
            {"name": "reset", "a": 1, "b": 2, "op": "+", "fail": "reset"},
            {"name": "gold", "a": 1, "b": 2, "op": "+", "fail": "gold"},
            {"name": "no_gold", "a": 1, "b": 2, "op": "+", "fail": "no_gold"},
            {"name": "ok-too", "a": 3, "b": 2, "op": "-"}]
    finished: list[str] = []
    results = asyncio.run(play_gold(FlakyEnv, None, rows, concurrency=2,
                                    on_result=lambda r: finished.append(r.task_name)))
    by_name = {r.task_name: r for r in results}
    assert sorted(CLOSED) == sorted(r["name"] for r in rows)  # closed once each, errors or not
    assert sorted(finished) == sorted(by_name)
    assert by_name["ok"].reward == by_name["ok-too"].reward == 1.0 and by_name["ok-too"].error is None
    # an exception inside take_action: astep turns it into truncated=True with info["error"]
    assert by_name["step"].error == "RuntimeError: calculator on fire"
    assert by_name["step"].truncated and by_name["step"].turns == 1 and by_name["step"].end == "error"
    assert by_name["reset"].error == "ConnectionError: container did not start" and by_name["reset"].turns == 0
    assert by_name["gold"].error == "FileNotFoundError: solve.sh"
    assert by_name["no_gold"].no_gold and by_name["no_gold"].error is None and by_name["no_gold"].end == "no gold"
    problems = {name: r.problem((0.0, 1.0)) for name, r in by_name.items()}
    assert problems["ok"] is None and problems["ok-too"] is None
    assert problems["step"] == "error: RuntimeError: calculator on fire"
    assert problems["no_gold"] == "the env has no gold actions for this task"


def test_play_gold_runs_episodes_concurrently():
    async def main() -> list[OracleResult]:
        MeetingEnv.barrier = asyncio.Barrier(3)  # passes only when 3 episodes are inside atake_action at once
        return await play_gold(MeetingEnv, {}, ROWS[:2] + [{"id": "third", "a": 1, "b": 1, "op": "+"}],
                               concurrency=3)

    results = asyncio.run(main())
    assert [r.error for r in results] == [None, None, None]
    assert [r.reward for r in results] == [1.0, 1.0, 1.0] and MeetingEnv.most_active == 3


def test_play_gold_never_runs_more_than_concurrency_episodes():
    rows = [{"id": f"t{i}", "a": i, "b": 1, "op": "+"} for i in range(8)]
    results = asyncio.run(play_gold(MeetingEnv, {}, rows, concurrency=2))
    assert all(r.reward == 1.0 for r in results)
    assert 1 <= MeetingEnv.most_active <= 2
    assert sorted(CLOSED) == sorted(f"t{i}" for i in range(8))


def test_play_gold_stops_at_the_end_of_the_episode_and_notes_an_unfinished_one():
    class TwoStep(ArithmeticEnv):
        def take_action(self, action):
            if action == "wait":
                return StepResult([{"role": "user", "content": "go on"}], 0.25, False, False, {})
            return super().take_action(action)

        def gold_actions(self):
            return self.task["gold"]

    rows = [{"name": "extra", "a": 1, "b": 1, "op": "+", "gold": ["wait", "2", "never played"]},
            {"name": "short", "a": 1, "b": 1, "op": "+", "gold": ["wait"]}]
    extra, short = asyncio.run(play_gold(TwoStep, {"max_turns": 5}, rows))
    assert (extra.turns, extra.reward, extra.terminated) == (2, 1.25, True)
    assert (short.turns, short.end) == (1, "unfinished")
    assert short.problem((0.0, 1.0)).startswith("the gold actions did not terminate the episode")


def test_play_gold_rejects_a_concurrency_below_one():
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(play_gold(ArithmeticEnv, {}, ROWS, concurrency=0))


# -- skyrl rollout --oracle -----------------------------------------------------------------------


def test_rollout_oracle_names_the_failed_task_and_writes_jsonl(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    out = tmp_path / "oracle.jsonl"
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--n-tasks", "0", "--out", str(out),
                       env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "oracle failed on 1 task(s): broken-task" in result.output
    assert "broken-task: the gold actions scored 0, expected the top of reward_range 1" in result.output
    lines = _read_jsonl(out)
    assert [line["task_name"] for line in lines] == ["add", "mul", "broken-task"]
    assert lines[0] == {"env": "arith", "task_name": "add", "index": 0, "reward": 1.0, "turns": 1,
                        "terminated": True, "truncated": False, "error": None, "metrics": {"operands": 2.0},
                        "no_gold": False, "ceiling": None, "report": {}}
    assert lines[2]["reward"] == 0.0
    assert sorted(CLOSED) == ["add", "broken-task", "mul"]


def test_rollout_oracle_reports_an_env_that_raises_by_name(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    out = tmp_path / "oracle.jsonl"
    result = skyrl_cli("rollout", "--env", "arith_flaky", "--oracle", "--n-tasks", "0", "--concurrency", "1",
                       "--out", str(out), env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "oracle failed on 1 task(s): explodes" in result.output
    assert "calculator on fire" in result.output and "error" in result.output
    by_name = {line["task_name"]: line for line in _read_jsonl(out)}
    assert by_name["explodes"]["error"] == "RuntimeError: calculator on fire" and by_name["explodes"]["truncated"]
    assert by_name["add"]["reward"] == by_name["mul"]["reward"] == 1.0  # the crash stopped no other task


def test_rollout_oracle_passes_and_needs_no_engine(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(row) for row in ROWS[:2]) + "\n")
    out = tmp_path / "sub" / "oracle.jsonl"
    # the engine does not exist: --oracle never loads one, and says the flags are unused
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--tasks", str(tasks), "--out", str(out),
                       "--engine", "no_such_engine", "--model", "none", "--samples", "3")
    assert result.exit_code == 0, result.output
    assert "oracle solved all 2 task(s)" in result.output
    assert "--engine, --model, --samples are not used" in result.output
    assert [line["reward"] for line in _read_jsonl(out)] == [1.0, 1.0]


def test_rollout_oracle_n_tasks_limits_the_rows(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    out = tmp_path / "oracle.jsonl"
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--n-tasks", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert [line["task_name"] for line in _read_jsonl(out)] == ["add", "mul"]


def test_rollout_oracle_config_errors_name_the_key(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    out = tmp_path / "oracle.jsonl"
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--out", str(out), "env.max_turnz=1")
    assert result.exit_code == 2 and "env.max_turnz: unknown key" in result.output
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--out", str(out), "evn.max_turns=1")
    assert result.exit_code == 2 and "unknown config section 'evn'" in result.output
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--out", str(out), "--concurrency", "0")
    assert result.exit_code == 2
    assert not out.exists()


def test_rollout_oracle_applies_env_overrides(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(OracleEnvsPlugin())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"name": "long", "a": 1, "b": 1, "op": "+", "gold": "x" * 50}) + "\n")
    out = tmp_path / "oracle.jsonl"
    result = skyrl_cli("rollout", "--env", "arith", "--oracle", "--tasks", str(tasks), "--out", str(out),
                       "env.max_action_chars=10")
    assert result.exit_code == 1 and "oracle failed on 1 task(s): long" in result.output
    (line,) = _read_jsonl(out)
    assert line["reward"] == 0.0 and line["truncated"]  # rejected unread as too long, at the turn limit


# -- skyrl check ------------------------------------------------------------------------------------


def test_check_names_each_gold_check_by_its_task(skyrl_cli, register_skyrl_plugin):
    register_skyrl_plugin(OracleEnvsPlugin())
    result = skyrl_cli("check", "arith", "--n-tasks", "0")
    assert result.exit_code == 1, result.output
    assert "PASS  gold[row 1] (add)" in result.output and "PASS  gold[row 2] (mul)" in result.output
    assert "FAIL  gold[row 3] (broken-task): the gold actions scored 0, expected the top of reward_range 1" in result.output
    assert "1 failed" in result.output
    two = skyrl_cli("check", "arith")  # default: the first 2 rows
    assert two.exit_code == 0 and "gold[row 2] (mul)" in two.output and "gold[row 3]" not in two.output
    assert skyrl_cli("check", "arith", "--n-tasks", "-1").exit_code == 2


def test_check_env_keeps_stable_ids_and_labels_the_gold_checks():
    report = check_env(ArithmeticEnv, n_tasks=2)
    assert {"gold[row 1]", "gold[row 2]"} <= set(report.passed) and not report.failed
    assert report.label("gold[row 2]") == "gold[row 2] (mul)" and report.label("pickle") == "pickle"
    nameless = check_env(ArithmeticEnv, tasks=[{"a": 1, "b": 1, "op": "+"}])
    assert nameless.label("gold[row 1]") == "gold[row 1]"
    with pytest.raises(EnvCheckError, match=r"gold\[row 3\] \(broken-task\): the gold actions scored 0"):
        check_env(ArithmeticEnv, n_tasks=0)


def test_check_env_skips_a_task_without_gold_and_fails_one_whose_env_raises():
    report = check_env(FlakyEnv, tasks=[{"name": "none", "a": 1, "b": 1, "op": "+", "fail": "no_gold"},
                                        {"name": "boom", "a": 1, "b": 1, "op": "+", "fail": "gold"}],
                       raise_on_failure=False)
    assert "gold[row 1]" in report.skipped
    assert "gold[row 2] (boom): error: FileNotFoundError: solve.sh" in report.failed


def test_a_reward_above_the_top_of_the_range_is_a_problem_too():
    over = OracleResult("over", 0, reward=1.5, turns=1, terminated=True)
    assert over.problem((0.0, 1.0)) == "the gold actions scored 1.5, expected the top of reward_range 1"
    assert OracleResult("ok", 1, reward=1.0, turns=1, terminated=True).problem((0.0, 1.0)) is None
