"""Execution accuracy over the built-in test split, driven through the real generator and a
scripted engine that solves exactly the questions we choose."""

from __future__ import annotations

import pytest
from skyrl_core.testing.scripted_engine import ScriptedEngine
from skyrl_core.testing.tokenizers import make_tokenizer
from skyrl_sql.data.builtin import builtin_rows
from skyrl_sql.evaluate import STOP, default_generator_config, evaluate


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer("chatml")


def scripted_analyst(tokenizer, rows, solved: set[str]):
    """Explores once, then submits the gold query for ``solved`` ids and a wrong one for the rest."""
    by_question = {row["question"]: row for row in rows}

    def reply(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        row = next(r for q, r in by_question.items() if q in prompt)
        if "<reminder>" not in prompt:  # no observation yet
            return "<think>First look at the tables.</think><sql>SELECT name FROM sqlite_master</sql>"
        sql = row["reward_spec"]["ground_truth"] if row["id"] in solved else "SELECT 'wrong'"
        return f"<think>Now I know.</think><solution>{sql}</solution>"

    return reply


async def test_evaluate_reports_execution_accuracy_per_difficulty(tokenizer):
    rows = builtin_rows("test")
    solved = {row["id"] for row in rows if row["difficulty"] != "hard"}
    engine = ScriptedEngine(tokenizer, default=scripted_analyst(tokenizer, rows, solved))
    report = await evaluate(engine, tokenizer, rows)
    assert report.episodes == len(rows) == 8
    assert report.execution_accuracy == pytest.approx(len(solved) / len(rows))
    assert report.accuracy_by_difficulty["hard"] == 0.0
    assert report.accuracy_by_difficulty["easy"] == 1.0 and report.accuracy_by_difficulty["medium"] == 1.0
    assert report.exact_match == report.execution_accuracy
    assert (report.format_ok, report.mean_turns, report.execution_errors_per_episode) == (1.0, 2.0, 0.0)
    assert report.failed_episodes == 0
    assert f"execution accuracy              {len(solved) / 8:.3f}" in report.table()


async def test_evaluation_uses_skyrl_sql_generation_settings():
    config = default_generator_config()
    assert config.stop == STOP == ["</sql>", "</solution>"]
    assert config.temperature == 0.0 and config.n_samples_per_prompt == 1
