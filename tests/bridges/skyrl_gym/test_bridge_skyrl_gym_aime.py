"""aime through the bridge on hand-written rows (its rows carry reward_model, not reward_spec, in skyrl-gym 0.4.0)."""

from __future__ import annotations

from skyrl_bridge_skyrl_gym.config import SkyRLGymConfig
from skyrl_core.factory import env_class
from skyrl_core.testing import check_adversarial, check_env


def aime_rows():
    return [{"id": f"aime-{i}", "env_class": "aime", "data_source": "bridge-test",
             "prompt": [{"role": "user", "content": f"{question} End with 'Answer: <your answer>'."}],
             "reward_model": {"ground_truth": answer}, "extra_info": {}}
            for i, (question, answer) in enumerate([("What is 17 times 3?", "51"), ("What is 2 to the 10th?", "1024")])]


def test_aime_passes_check_env_and_pays_minus_one_for_anything_wrong(tmp_path, rows_io):
    path = rows_io.write_jsonl(tmp_path / "aime.jsonl", aime_rows())
    config = {"name": "aime", "data_files": {"train": str(path)}}
    report = check_env("skyrl_gym", config=config, n_tasks=2)
    assert not report.failed and "gold[row 2]" in report.passed
    cls = env_class("skyrl_gym")
    env = cls(task=aime_rows()[0], config=SkyRLGymConfig(**config))
    env.reset(seed=0)
    assert env.step("").reward == -1.0  # rejected: the peer scores an empty reply like any wrong one
    adversarial = check_adversarial("skyrl_gym", config=config, quick=True)
    assert adversarial.ok, adversarial.problems()
