"""The bridge's bundled verifiers taskset (the default ``env.name``): small sums, answered in ``<answer>`` tags.

Its task has two weighted rewards, as a verifiers rubric would: ``correct`` (weight 1) and ``format`` (weight
0.2, the reply has exactly one ``<answer>...</answer>``). Rows are built in; ``load_environment()`` returns the
taskset (a plain taskset runs as verifiers' ``SingleAgentEnv`` would: one reply).
"""

from __future__ import annotations

import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "Solve the problem. Give the final number as <answer>N</answer>."
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        found = ANSWER.findall(trace.last_reply)
        return float(len(found) == 1 and found[0].strip() == task.answer)

    @vf.reward(weight=0.2)
    async def format(self, trace: vf.Trace) -> float:
        return float(len(ANSWER.findall(trace.last_reply)) == 1)

    def gold_reply(self) -> str:
        return f"<answer>{self.data.answer}</answer>"


class SumConfig(vf.TasksetConfig):
    count: int = 20


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.count):
            a, b = 3 + 7 * i % 41, 11 + 13 * i % 37
            yield SumTask(SumData(name=f"sum-{i}", prompt=f"What is {a} + {b}?", system_prompt=SYSTEM_PROMPT,
                                  answer=str(a + b)), self.config.task)


def load_environment(count: int = 20) -> SumTaskset:
    return SumTaskset(SumConfig(count=count))
