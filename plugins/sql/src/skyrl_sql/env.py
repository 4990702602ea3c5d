"""``sql``: answer a question with SQL against a real, read-only database, over several turns.

Each turn the model writes ``<sql>QUERY</sql>`` to run a query (it sees the result, the error or
which limit stopped the query) or ``<solution>QUERY</solution>`` to submit. The episode ends at the
solution or at the turn limit, and is scored then: the format penalty if the model's actions break
SkyRL-SQL's format rules (observations are never read for this), else 1 if the submitted query's
result matches the gold query's result and 0 if not. Queries run in sandbox worker processes
(:mod:`skyrl_sql.sandbox`); ``info["sandbox_backend"]`` says which skyrl-sandbox backend holds them,
and the ``sandbox_strong`` metric whether it is a strong one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from skyrl_core import EnvConfig, StepResult, TextEnv
from skyrl_sandbox.choice import strong_names
from skyrl_sandbox.node import worker_resources

from skyrl_sql.config import SQLEnvConfig
from skyrl_sql.data.builtin import builtin_rows
from skyrl_sql.data.loaders import DatasetError, load_questions, resolve_database
from skyrl_sql.prompts import system_prompt, user_prompt
from skyrl_sql.render import INVALID_ACTION, observation, result_body
from skyrl_sql.reward import normalize_sql, orders_result, results_match
from skyrl_sql.sandbox import QueryRunner, SandboxSettings, get_runner, message_cap_mb
from skyrl_sql.tags import check_format, first_query, has_solution
from skyrl_sql.worker.result import QueryRequest, QueryResult

SCHEMA_QUERIES = {
    "sqlite": "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid",
    "duckdb": "SELECT sql FROM duckdb_tables() UNION ALL SELECT sql FROM duckdb_views() WHERE NOT internal",
}
SCHEMA_MAX_BYTES = 16_000_000


class SQLEnv(TextEnv):
    config_class = SQLEnvConfig
    config: SQLEnvConfig
    reward_range = (-1.0, 1.0)

    @classmethod
    def ray_resources(cls, config: SQLEnvConfig) -> dict[str, float]:
        return worker_resources(config.sandbox)

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: SQLEnvConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self.backend = "none"  # the sandbox backend running the queries, once known
        self._new_episode()

    def _new_episode(self) -> None:
        self.actions: list[str] = []  # the model's own text, the only input of the format check
        self.execution_errors = 0
        self.invalid_turns = 0
        self.outcome: dict[str, float] = {}
        self._db_path: Path | None = None
        self._db_root: Path | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._new_episode()
        prompt, info = super().reset(seed=seed, options=options)
        return prompt, {**info, "sandbox_backend": self.backend}

    # -- task -------------------------------------------------------------------------------------

    @property
    def gold_sql(self) -> str:
        gold = (self.task.get("reward_spec") or {}).get("ground_truth")
        if not isinstance(gold, str) or not gold.strip():
            raise ValueError(f"sql task {self.task.get('id', '?')} has no reward_spec.ground_truth (gold SQL)")
        return gold

    def database(self) -> Path:
        if self._db_path is None:
            c = self.config
            self._db_path = resolve_database(self.task, c.engine, c.db_root, c.cache_dir)
        return self._db_path

    def database_root(self) -> Path:
        """The folder the sandbox shows its workers (read-only): ``db_root``, the built-in databases' folder,
        or the database's own folder."""
        if self._db_root is None:
            db, c = self.database(), self.config
            if c.db_root and db.resolve().is_relative_to(Path(c.db_root).resolve()):
                self._db_root = Path(c.db_root)
            elif self.task.get("data") == "builtin" and not self.task.get("db_path"):
                self._db_root = db.parent.parent
            else:
                self._db_root = db.parent
        return self._db_root

    def build_prompt(self) -> list[dict[str, str]]:
        prompt = self.task.get("prompt")
        if isinstance(prompt, list) and prompt:
            return [{"role": m["role"], "content": m["content"]} for m in prompt]
        question = self.task.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"sql task {self.task.get('id', '?')} has no 'question' and no 'prompt'")
        c = self.config
        schema = database_schema(self._sandbox(), c.engine, str(self.database()))
        return [
            {"role": "system", "content": system_prompt(engine=c.engine, max_turns=c.max_turns,
                                                        shown_rows=c.max_observation_rows,
                                                        require_think=c.require_think)},
            {"role": "user", "content": user_prompt(schema=schema, question=question,
                                                    external_knowledge=self.task.get("external_knowledge") or "")},
        ]

    def gold_actions(self) -> list[str]:
        return [f"<think>The gold query answers this.</think>\n<solution>{self.gold_sql}</solution>"]

    def null_action(self) -> str:
        """A well-formed submission of a query that returns nothing: format right, answer empty."""
        return "<think>I do not know.</think>\n<solution>SELECT 1 WHERE 1 = 0</solution>"

    # -- turns ------------------------------------------------------------------------------------

    def take_action(self, action: str) -> StepResult:
        self.actions.append(action)
        if has_solution(action) or self.turn >= self.max_turns:
            return self._score(submitted=has_solution(action))
        query = first_query(action)
        if query is None:
            self.invalid_turns += 1
            return self._reply(INVALID_ACTION, {"query_status": "invalid"})
        c = self.config
        result = self._run(query, c.query_timeout_s, c.max_rows)
        self.execution_errors += not result.ok
        body = result_body(result, max_rows=c.max_rows, max_bytes=c.max_result_bytes,
                           shown_rows=c.max_observation_rows, max_chars=c.max_observation_chars)
        return self._reply(body, {"query_status": result.status})

    def reject_action(self, problem: str) -> StepResult:
        """A turn the base class rejected unread (empty, not text, too long) counts like a turn
        without ``<sql>``: ``problem`` is the observation, and at the last turn the episode is
        scored as usual, so its missing solution gets the format penalty."""
        if self.turn >= self.max_turns:
            scored = self._score(submitted=False)
            return scored._replace(info={**scored.info, "invalid_action": problem})
        self.invalid_turns += 1
        return self._reply(problem, {"query_status": "invalid", "invalid_action": problem})

    def _reply(self, body: str, info: dict[str, Any]) -> StepResult:
        text = observation(body, self.max_turns - self.turn)
        return StepResult([{"role": "user", "content": text}], 0.0, False, False,
                          {**info, "sandbox_backend": self.backend})

    def _score(self, *, submitted: bool) -> StepResult:
        c = self.config
        fmt = check_format(self.actions, require_think=c.require_think)
        match, exact, reason = False, False, fmt.problem
        if fmt.ok and fmt.solution is not None:
            gold = self._gold_result()
            predicted = self._run(fmt.solution, c.reward_timeout_s, c.reward_max_rows)
            exact = normalize_sql(fmt.solution) == normalize_sql(self.gold_sql)
            if not predicted.ok:
                reason = f"the submitted query failed ({predicted.status}): {predicted.message}"
            elif predicted.cut:
                reason = f"the submitted query's result exceeded the {predicted.cut} cap"
            else:
                match = results_match(predicted.rows, gold.rows, ordered=orders_result(self.gold_sql),
                                      duplicates=c.duplicates)
                reason = "" if match else "the result differs from the gold result"
        reward = (1.0 if match else 0.0) if fmt.ok else c.format_penalty
        self.outcome = {"format_ok": float(fmt.ok), "execution_match": float(match), "exact_match": float(exact),
                        "submitted": float(submitted)}
        info = {"reward_components": {"format": float(fmt.ok), "execution_match": float(match)},
                "solution_sql": fmt.solution, "exact_match": exact, "why": reason, "sandbox_backend": self.backend}
        return StepResult([], reward, submitted, False, info)

    def _gold_result(self) -> QueryResult:
        c = self.config
        gold = cached_gold_result(self._sandbox(), self._request(self.gold_sql, c.reward_timeout_s, c.reward_max_rows))
        if not gold.ok or gold.cut:
            raise RuntimeError(f"gold SQL of task {self.task.get('id', '?')} cannot be scored "
                               f"({gold.status}{', ' + gold.cut + ' cap hit' if gold.cut else ''}): {gold.message}")
        return gold

    def _run(self, sql: str, timeout_s: float, max_rows: int) -> QueryResult:
        return self._sandbox().run(self._request(sql, timeout_s, max_rows))

    def _request(self, sql: str, timeout_s: float, max_rows: int) -> QueryRequest:
        c = self.config
        return QueryRequest(c.engine, str(self.database()), sql, timeout_s, max_rows, c.max_result_bytes)

    def _sandbox(self) -> QueryRunner:
        c = self.config
        runner = get_runner(SandboxSettings(c.sandbox, c.engine, c.memory_limit_mb, c.sandbox_workers,
                                            c.sandbox_cpu_time_s, message_cap_mb(max(c.max_result_bytes,
                                                                                     SCHEMA_MAX_BYTES))))
        runner.add_root(self.database_root())
        self.backend = runner.backend
        return runner

    # -- metrics and data -------------------------------------------------------------------------

    def get_metrics(self) -> dict[str, float]:
        return {"turns": float(self.turn), "execution_errors": float(self.execution_errors),
                "invalid_turns": float(self.invalid_turns), "format_ok": 0.0, "execution_match": 0.0,
                "exact_match": 0.0, "submitted": 0.0, **self.outcome,
                "sandbox_strong": float(self.backend in strong_names())}

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        files = config.data_files if isinstance(config, SQLEnvConfig) else {}
        if not files:
            return builtin_rows(split)
        if split not in files:
            raise DatasetError(f"env.data_files has no split {split!r}; it has: {', '.join(sorted(files))}")
        return load_questions(files[split])


@lru_cache(maxsize=256)
def database_schema(runner: QueryRunner, engine: str, db_path: str) -> str:
    """The database's CREATE statements, read through the sandbox like any other query."""
    result = runner.run(QueryRequest(engine, db_path, SCHEMA_QUERIES[engine], 30.0, 10_000, SCHEMA_MAX_BYTES))
    if not result.ok:
        raise RuntimeError(f"cannot read the schema of {db_path}: {result.status}: {result.message}")
    return "\n".join(f"{row[0].rstrip(';')};" for row in result.rows if row[0])


_GOLD_RESULTS: dict[tuple[int, QueryRequest], QueryResult] = {}
_GOLD_CACHE_SIZE = 4096
_GOLD_LOCK = threading.Lock()


def cached_gold_result(runner: QueryRunner, request: QueryRequest) -> QueryResult:
    """Gold results are asked for by every sample of a group; run each gold query once (if it works)."""
    key = (id(runner), request)
    with _GOLD_LOCK:
        result = _GOLD_RESULTS.get(key)
    if result is None:
        result = runner.run(request)
        if result.ok and not result.cut:
            with _GOLD_LOCK:
                if len(_GOLD_RESULTS) >= _GOLD_CACHE_SIZE:
                    _GOLD_RESULTS.pop(next(iter(_GOLD_RESULTS)))
                _GOLD_RESULTS[key] = result
    return result
