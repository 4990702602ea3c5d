"""``reasoning_gym``: a reasoning-gym dataset's question, one reply, the dataset's own ``score_answer``.

The prompt is the peer's question text with a short instruction: put the final answer between answer tags.
The reply's answer is read by :func:`skyrl_bridge_reasoning_gym.answer.extract_answer` (exactly one
``<answer>...</answer>`` block; none, several or a broken one answer nothing) and scored by the dataset's
``score_answer(answer, entry)`` on the peer's own entry, rebuilt from the row's ``source`` (dataset, options,
index), so metadata JSON would change (tuples, Fractions) is scored as the peer made it. With ``env.max_turns``
above 1 (default 1), a reply without any answer tag is told so and gets another turn; the first reply with an
answer tag ends the episode. A rejected reply (empty, over-long) on the last turn is scored as a missing answer,
the peer's own score for that (0 for most datasets, 0.01 for a few); so is an answer the dataset's scorer raises on.
Datasets whose scorer runs the answer as Python (``eval``, ``sympy.parse_expr``) score it only if the guard
admits it (:mod:`skyrl_bridge_reasoning_gym.guard`), in a forked child with limits
(:mod:`skyrl_bridge_reasoning_gym.sandbox`); a refused answer or a stopped child scores as a missing answer.

Per task: the gold action is ``<answer>{the entry's answer}</answer>`` when the dataset's own score of it is above
0; :meth:`ReasoningGymEnv.reward_ceiling` is that score (a few datasets score their own answer below 1).
Open-ended datasets (their entries' answer is ``None``: any valid solution scores) have no gold and a ceiling of 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_core import EnvConfig, StepResult, TextEnv

from skyrl_bridge_reasoning_gym import peer
from skyrl_bridge_reasoning_gym.answer import answer_block, extract_answer, has_answer_tag
from skyrl_bridge_reasoning_gym.config import ReasoningGymConfig
from skyrl_bridge_reasoning_gym.guard import EVALUATING, admissible
from skyrl_bridge_reasoning_gym.sandbox import ChildFailed, ChildRaised

# The closing tag is named before the opening one, so this text holds no answer block of its own: a policy that
# sends the prompt back answers nothing.
INSTRUCTION = ("Work the problem out, then give your final answer alone inside answer tags (the closing tag is "
               "</answer>, the opening tag <answer>). Give exactly one answer block: a reply with none or with "
               "several counts as no answer. Follow the answer format the question asks for.")
NO_ANSWER = ("Your reply has no answer tags. Reply with your final answer between an opening answer tag and a "
             "closing one (the closing tag is </answer>, the opening tag <answer>).")
_EPS = 1e-9


class ReasoningGymEnv(TextEnv):
    config_class = ReasoningGymConfig
    config: ReasoningGymConfig
    reward_range = (0.0, 1.0)

    def __init__(self, task: Mapping[str, Any] | None = None,
                 config: ReasoningGymConfig | Mapping[str, Any] | None = None) -> None:
        super().__init__(task, config)
        self._generated = not self.task  # no row given: each reset makes one from its seed
        self._new_episode()

    def _new_episode(self) -> None:
        self._entry: dict[str, Any] | None = None
        self._scorer: tuple[str, dict[str, Any]] | None = None
        self._gold_score: float | None = None
        self.answer: str | None = None
        self.score: float | None = None
        self.answered = False
        self.score_error: str | None = None
        self.scorer_refused = 0  # answers the guard kept from a scorer that evaluates them
        self.scorer_timeouts = 0  # scorer children stopped: past their time, dead, or over a limit

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_entry"] = None  # the peer's entry is rebuilt from the task where it is needed
        state["_gold_score"] = None
        return state

    # -- the task -----------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._new_episode()
        if options and "task" in options:
            self._generated = False
        elif self._generated:
            self.task = self._task_from_seed(seed)
        return super().reset(seed=seed, options=options)

    def _task_from_seed(self, seed: int | None) -> dict[str, Any]:
        """Item 0 of the dataset seeded with ``seed`` (default: env.args.seed, else 0): Gymnasium-style use."""
        c = self.config
        base = c.args.get("seed") if seed is None else seed
        base = peer.DEFAULT_SEED if base is None else int(base) % (peer.MAX_SEED + 1)
        row = peer.make_row(c.name, c.args, "train", base, 0, size=1)
        return {**row, "name": f"{c.name}-seed{base}"}

    def _load(self) -> dict[str, Any]:
        """The peer's entry for the task (rebuilt from its source when it has one) and how to score it."""
        if self._entry is not None:
            return self._entry
        row, c = self.task, self.config
        label = row.get("name", "the task")
        dataset = row.get("dataset", c.name)
        if dataset != c.name:
            raise ValueError(f"{label} is a row of reasoning-gym dataset {dataset!r}, but env.name is {c.name!r}; "
                             f"set env.name={dataset}")
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{label} has no 'question' (a reasoning_gym row needs question, answer, metadata)")
        source = row.get("source")
        if isinstance(source, Mapping):
            options = dict(source.get("options") or {})
            entry = peer.entry(source.get("dataset", dataset), options, int(source.get("index", 0)))
            if str(entry.get("question")) != question:
                raise ValueError(f"{label}: reasoning-gym makes another question for its source {dict(source)} "
                                 f"(the row was made by another reasoning-gym version or changed); rebuild the rows")
            self._scorer = (str(source.get("dataset", dataset)), options)
        else:  # a row from elsewhere: its own fields are the entry
            entry = {"question": question, "answer": row.get("answer"), "metadata": dict(row.get("metadata") or {})}
            self._scorer = (dataset, {**c.args, "seed": c.args.get("seed") or peer.DEFAULT_SEED, "size": 1})
        self._entry = entry
        return entry

    def build_prompt(self) -> list[dict[str, str]]:
        question = str(self._load()["question"])
        if self.config.system_prompt:
            return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]
        return [{"role": "user", "content": f"{question}\n\n{INSTRUCTION}"}]

    def _score(self, answer: str | None) -> float:
        """The dataset's score of ``answer``. Some scorers raise on malformed text (``prime_factorization`` on
        ``x33``): such an answer scores as a missing one, never as an env error (that would drop the episode
        from training, a way out of a low reward).

        The scorers that evaluate the answer as Python (:data:`EVALUATING`) see it only if the guard admits it,
        and then in a forked child with memory and CPU limits and ``env.scorer_timeout_s`` of wall clock; a
        refused answer or a stopped child scores as a missing answer (counted: ``scorer_refused``,
        ``scorer_timeouts``). No answer and the dataset's own answer are scored in this process."""
        entry = self._load()
        assert self._scorer is not None
        name, options = self._scorer
        scorer = str(entry.get("metadata", {}).get("source_dataset", name)) if name == peer.COMPOSITE else name
        timeout_s = None
        if scorer in EVALUATING and answer is not None and answer != self._gold_answer():
            if not admissible(scorer, answer):
                self.scorer_refused += 1
                self.score_error = "the answer is not a plain literal or small arithmetic; this dataset's scorer " \
                                   "would run it as Python, so it is scored as a missing answer"
                return peer.score(name, options, None, entry)
            timeout_s = self.config.scorer_timeout_s
        try:
            return peer.score(name, options, answer, entry, timeout_s=timeout_s)
        except ChildFailed as exc:
            self.scorer_timeouts += 1
            self.score_error = f"{exc}; scored as a missing answer"
        except Exception as exc:  # noqa: BLE001 - the peer's scorer failing on model text is a wrong answer
            if answer is None:
                raise
            self.score_error = (str(exc) if isinstance(exc, ChildRaised) else f"{type(exc).__name__}: {exc}")[:300]
        return peer.score(name, options, None, entry)

    def _gold_answer(self) -> str | None:
        answer = self._load().get("answer")
        return None if answer is None else str(answer)

    def gold_score(self) -> float | None:
        """The dataset's score of its own answer, given as the gold action (``None``: open-ended, no answer)."""
        if self._gold_score is None:
            gold = self._gold_answer()
            if gold is None:
                return None
            self._gold_score = self._score(extract_answer(answer_block(gold)))
        return self._gold_score

    def gold_actions(self) -> list[str] | None:
        gold = self._gold_answer()
        if gold is None or not (self.gold_score() or 0.0) > 0.0:
            return None
        return [answer_block(gold)]

    def reward_ceiling(self) -> float:
        """The dataset's score of its own answer where it scores it above 0, else the top of the range."""
        score = self.gold_score()
        return min(score, self.reward_range[1]) if score else self.reward_range[1]

    # -- turns ----------------------------------------------------------------------------------------------

    def take_action(self, action: str) -> StepResult:
        if not has_answer_tag(action) and self.turn < self.max_turns:
            return StepResult([{"role": "user", "content": NO_ANSWER}], 0.0, False, False, {"answered": False})
        return self._final(extract_answer(action), {})

    def reject_action(self, problem: str) -> StepResult:
        """Empty or over-long: told so while turns remain; on the last turn, scored as a missing answer."""
        if self.turn < self.max_turns:
            return StepResult([{"role": "user", "content": problem}], 0.0, False, False, {"invalid_action": problem})
        result = self._final(None, {"invalid_action": problem})
        return result._replace(observation=[{"role": "user", "content": problem}])

    def _final(self, answer: str | None, info: dict[str, Any]) -> StepResult:
        self.answer, self.answered = answer, answer is not None
        self.score = self._score(answer)
        info = {**info, "answered": self.answered, "score": self.score,
                "answer": None if answer is None else answer[:1000]}
        if self.score_error:
            info["score_error"] = self.score_error
        return StepResult([], self.score, True, False, info)

    def get_metrics(self) -> dict[str, float]:
        score = self.score or 0.0
        return {"score": score, "answered": float(self.answered),
                "correct": float(self.score is not None and score >= self.reward_ceiling() - _EPS),
                "scorer_refused": float(self.scorer_refused), "scorer_timeouts": float(self.scorer_timeouts)}

    # -- built-in rows ---------------------------------------------------------------------------------------

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        """Rows made by the peer: ``train`` from seed ``env.args.seed`` (default 0), ``size`` rows (default 64);
        ``test`` from a seed 2**30 away, ``env.test_size`` rows (default 16), none repeating a train question."""
        c = config if isinstance(config, ReasoningGymConfig) else ReasoningGymConfig()
        return peer.make_rows(c.name, c.args, split, c.test_size)
