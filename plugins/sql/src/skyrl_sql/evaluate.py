"""Execution accuracy of an inference engine over a split: one greedy episode per question.

    report = asyncio.run(evaluate(engine, tokenizer, SQLEnv.load_dataset("test", config), env_config=config))
    print(report.table())

``skyrl rollout --env sql ...`` prints the same numbers as ``env/execution_match`` and friends;
this helper adds the per-difficulty breakdown and SkyRL-SQL's generation settings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_core import GeneratorConfig, InferenceEngine, MultiTurnGenerator, TrajectoryBatch

from skyrl_sql.config import SQLEnvConfig

# SkyRL-SQL stops generation at the end of a query or a solution, so each turn holds one action.
STOP = ["</sql>", "</solution>"]


def default_generator_config() -> GeneratorConfig:
    return GeneratorConfig(n_samples_per_prompt=1, temperature=0.0, stop=list(STOP), max_tokens_per_turn=1024,
                           max_total_tokens=4096, max_context_length=8192)


@dataclass
class EvalReport:
    episodes: int
    execution_accuracy: float
    exact_match: float
    format_ok: float
    mean_turns: float
    execution_errors_per_episode: float
    failed_episodes: int
    accuracy_by_difficulty: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        lines = [f"{'episodes':<32}{self.episodes}",
                 f"{'execution accuracy':<32}{self.execution_accuracy:.3f}",
                 f"{'exact match':<32}{self.exact_match:.3f}",
                 f"{'format ok':<32}{self.format_ok:.3f}",
                 f"{'turns per episode':<32}{self.mean_turns:.2f}",
                 f"{'execution errors per episode':<32}{self.execution_errors_per_episode:.2f}",
                 f"{'failed episodes (infrastructure)':<32}{self.failed_episodes}"]
        lines += [f"{'accuracy, ' + level:<32}{value:.3f}" for level, value in sorted(self.accuracy_by_difficulty.items())]
        return "\n".join(lines)


async def evaluate(engine: InferenceEngine, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *,
                   env_config: SQLEnvConfig | Mapping[str, Any] | None = None,
                   generator_config: GeneratorConfig | None = None) -> EvalReport:
    """Play one episode per row and summarise; an episode that errors counts as wrong."""
    generator = MultiTurnGenerator(generator_config or default_generator_config(), engine=engine,
                                   tokenizer=tokenizer, env_id="sql", env_config=env_config)
    batch = await generator.generate(list(rows), n_samples=1)
    return summarize(batch)


def summarize(batch: TrajectoryBatch) -> EvalReport:
    episodes = list(batch.roots())
    if not episodes:
        raise ValueError("no episodes to evaluate")

    def mean(key: str) -> float:
        return sum(t.metrics.get(key, 0.0) for t in episodes) / len(episodes)

    by_level: dict[str, list[float]] = defaultdict(list)
    for t in episodes:
        by_level[str(t.task.get("difficulty", "unlabelled"))].append(t.metrics.get("execution_match", 0.0))
    return EvalReport(
        episodes=len(episodes), execution_accuracy=mean("execution_match"), exact_match=mean("exact_match"),
        format_ok=mean("format_ok"), mean_turns=mean("turns"),
        execution_errors_per_episode=mean("execution_errors"),
        failed_episodes=sum(t.error is not None for t in episodes),
        accuracy_by_difficulty={level: sum(v) / len(v) for level, v in by_level.items()})
