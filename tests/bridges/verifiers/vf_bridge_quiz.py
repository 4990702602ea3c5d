"""A single-turn verifiers taskset for the bridge's tests: capital cities in <answer> tags.

Two weighted rewards, like a verifiers rubric: ``correct`` (weight 1.0, the LAST <answer> tag matches) and
``format`` (weight 0.25, the reply has an <answer>...</answer> tag), plus ``long_penalty`` (weight -0.5, a reply
over 400 characters) so the range has a negative bottom. As a taskset id ("vf_bridge_quiz") verifiers' own
loader builds its ``SingleAgentEnv``; ``load_environment()`` returns the bare taskset.
"""

from __future__ import annotations

import re

import verifiers.v1 as vf

ROWS = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima")]
TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


class QuizData(vf.TaskData):
    answer: str


class QuizTask(vf.Task[QuizData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: QuizData, trace: vf.Trace) -> float:
        found = TAG.findall(trace.last_reply)
        return float(bool(found) and found[-1].strip().lower() == task.answer.lower())

    @vf.reward(weight=0.25)
    async def format(self, trace: vf.Trace) -> float:
        return float(bool(TAG.search(trace.last_reply)))

    @vf.reward(weight=-0.5)
    async def long_penalty(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) > 400)


class QuizConfig(vf.TasksetConfig):
    count: int = len(ROWS)


class QuizTaskset(vf.Taskset[QuizTask, QuizConfig]):
    def load(self):
        for country, capital in ROWS[: self.config.count]:
            yield QuizTask(QuizData(name=f"capital-{country.lower()}", prompt=f"What is the capital of {country}?",
                                    system_prompt="Answer with <answer>CITY</answer>.", answer=capital),
                           self.config.task)


class DownloadingTaskset(QuizTaskset):
    """A taskset whose load() fetches its rows from the Hub, as many verifiers envs do."""

    def load(self):
        from datasets import load_dataset

        for row in load_dataset("skyrl-test/never-downloaded-capitals", split="train"):
            yield QuizTask(QuizData(prompt=row["q"], answer=row["a"]), self.config.task)


def load_environment(count: int = len(ROWS)) -> QuizTaskset:
    return QuizTaskset(QuizConfig(count=count))


def load_downloading() -> QuizTaskset:
    return DownloadingTaskset(QuizConfig())


__all__ = ["QuizTaskset"]  # what verifiers' loader reads for the taskset id "vf_bridge_quiz"
