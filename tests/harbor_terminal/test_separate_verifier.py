"""``[verifier] environment_mode = "separate"`` on each backend that runs images: the tests run in their own image,
apart from the agent's.

The fixture ``tasks/separate-tests-image`` has an agent image without python3 and a tests image (built from
``tests/Dockerfile``) with python3 and a checker; the agent's answer reaches the tests only as an artifact,
and a ``[verifier] collect`` command's note only through ``/logs/artifacts``. Tests that ran in the agent's
machine could not pass, so the oracle's 1 shows they ran in their own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor_helpers import bash, play, runs_images
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_sandbox.machine_factory import machine_backends
from skyrl_sandbox.testing import require_backend

TASK = Path(__file__).parent / "tasks" / "separate-tests-image"
ROW = {"task_path": str(TASK), "name": "skyrl-tests/separate-tests-image", "steps": 1}
# A root agent's tricks in its own machine: a reward file written ahead and kept rewritten, fake tests, a python3.
FORGER = """mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt
printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh
printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/python3 && chmod +x /usr/bin/python3
echo 1 > /logs/artifacts/reward.txt
nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.1; done' >/dev/null 2>&1 &
echo wrong > /app/answer.txt"""


@pytest.fixture(params=[name for name in machine_backends() if runs_images(name)])
def image_backend(request: pytest.FixtureRequest) -> str:
    """Each backend that runs images in turn, skipped (failed under SKYRL_REQUIRE_<BACKEND>=1) where it cannot run."""
    require_backend(request.param)
    return request.param


def final(results) -> tuple[float, dict]:
    assert results and (results[-1].terminated or results[-1].truncated), results
    assert "error" not in results[-1].info, results[-1].info["error"]
    return sum(result.reward for result in results), results[-1].info


def play_oracle(row: dict, backend: str, first: str) -> list:
    """``first``, then the task's oracle (its solution placed at /solution, as the oracle's are)."""
    env = HarborTerminalEnv(task=row, config={"backend": backend})
    try:
        env.reset(options={"task": row})
        oracle = env.gold_actions()
        assert oracle is not None
        results = [env.step(first)]
        results += [env.step(action) for action in oracle]
        return results
    finally:
        env.close()


def test_the_oracle_scores_1_in_the_tests_image_and_doing_nothing_scores_0(image_backend: str):
    look = bash("command -v python3 || echo 'no python3 here'; ls /opt/checker 2>&1 | head -1")
    results = play_oracle(ROW, image_backend, look)
    seen = results[0].observation[0]["content"]
    assert "no python3 here" in seen and "No such file" in seen, seen  # the agent's machine lacks both
    reward, info = final(results)
    assert reward == 1.0, info
    assert "ok" in info["verifier_output_tail"]
    results, _ = play(ROW, ["<done/>"], backend=image_backend)
    assert final(results)[0] == 0.0


def test_a_root_agent_forging_the_reward_in_its_own_machine_scores_0(image_backend: str, tmp_path: Path):
    task = tmp_path / "separate-root"
    shutil.copytree(TASK, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\n", "[agent]\nuser = \"root\"\n"))
    row = {**ROW, "task_path": str(task)}
    results, _ = play(row, [bash(FORGER), "<done/>"], backend=image_backend)
    reward, info = final(results)
    assert reward == 0.0, info
    results, _ = play(row, [bash(FORGER, "echo separate > /app/answer.txt", done=True)], backend=image_backend)
    assert final(results)[0] == 1.0  # the same machine, solved: the tricks did not break the verification
