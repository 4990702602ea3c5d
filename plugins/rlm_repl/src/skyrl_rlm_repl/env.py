"""``RLMReplEnv``: the model answers by running code in a sandboxed, persistent Python REPL.

Each turn, the ```repl blocks of the response run in order (see :mod:`skyrl_rlm_repl.parser`);
the observation is their output, cut to ``max_output_chars``. The episode ends when code calls
``FINAL``/``FINAL_VAR``, when the response holds a text ``FINAL(...)`` line, or at the turn limit.
The sandbox starts with the first code block and is closed by :meth:`close`.

The episode reward is the task's own score, plus the optional format shaping of
:class:`~skyrl_rlm_repl.config.FormatReward` (a block that runs, a final answer), each paid at most
once and only for what the model's own code did.

Sub-calls (``llm_query``, ``rlm_query`` ...) made by the code go to :attr:`subcall_handler`, which
whoever runs the env injects; the default answers every call with an error string saying that
sub-calls need the ``rlm_tree`` generator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from skyrl_core import EnvConfig, StepResult, TextEnv
from skyrl_sandbox.choice import strong_names
from skyrl_sandbox.loop import run_on_sandbox_loop, run_on_sandbox_loop_sync
from skyrl_sandbox.node import worker_resources

from skyrl_rlm_repl.config import RLMReplConfig
from skyrl_rlm_repl.evidence.dataset import load_tasks
from skyrl_rlm_repl.parser import ParsedResponse, parse_response
from skyrl_rlm_repl.prompts import WORKED_EXAMPLE, system_prompt
from skyrl_rlm_repl.rewards import score_answer
from skyrl_rlm_repl.sandbox import ExecResult, Sandbox
from skyrl_rlm_repl.starter import STARTER_SPLITS, starter_tasks
from skyrl_rlm_repl.subcalls import SUBCALL_METHODS, SubcallHandler, no_subcalls

log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 30.0


class _StepBudget:
    """Time one response may use: code running time across all its blocks, and wall clock with sub-calls."""

    def __init__(self, code_s: float, step_s: float) -> None:
        self.code_s_left = code_s
        self.deadline = asyncio.get_running_loop().time() + step_s
        self._step_s = step_s
        self._code_s = code_s

    def charge(self, result: ExecResult) -> None:
        self.code_s_left -= max(result.duration_s - result.subcall_wait_s, 0.0)

    @property
    def spent(self) -> str | None:
        """Why no further block may run, or None."""
        if self.code_s_left <= 0:
            return f"this response used its {self._code_s:g} s of code running time (sandbox.exec_timeout_s)"
        if asyncio.get_running_loop().time() >= self.deadline:
            return f"this response used its {self._step_s:g} s step budget (step_timeout_s)"
        return None


@cache
def evidence_scaffold() -> str:
    """Source of the evidence tools run in every REPL (list_papers, search, read_section)."""
    return (Path(__file__).parent / "evidence" / "scaffold.py").read_text(encoding="utf-8")


def task_context(task: Mapping[str, Any]) -> Any:
    """What ``context`` holds in the REPL: the papers of an evidence task, else the row's ``context``."""
    return task["papers"] if "papers" in task else task.get("context", "")


def task_has_papers(task: Mapping[str, Any]) -> bool:
    """An evidence task, or a child episode of one: the prompt documents the paper tools."""
    return "papers" in task or bool(task.get("rlm", {}).get("papers"))


class RLMReplEnv(TextEnv):
    """Recursive LM environment. Task rows: an evidence task, or ``prompt``/``question`` + ``context``."""

    config_class = RLMReplConfig
    config: RLMReplConfig

    @classmethod
    def ray_resources(cls, config: RLMReplConfig) -> dict[str, float]:
        return worker_resources(config.sandbox.backend)

    def __init__(self, task: Mapping[str, Any] | None = None, config: EnvConfig | Mapping[str, Any] | None = None,
                 *, subcall_handler: SubcallHandler | None = None) -> None:
        super().__init__(task, config)
        self.subcall_handler: SubcallHandler = subcall_handler or no_subcalls
        self._sandbox: Sandbox | None = None
        self._caller_loop: asyncio.AbstractEventLoop | None = None
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.final_answer: str | None = None
        self.task_reward = 0.0
        self._block_ran_clean = False
        self.backend = "none"
        self.counters = {"executions": 0, "sandbox_errors": 0, "sandbox_timeouts": 0, "sandbox_restarts": 0,
                         "subcall_requests": 0, "output_chars_cut": 0, "no_block_turns": 0}

    # -- the task ------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return int(self.task.get("rlm", {}).get("depth", 0))

    @property
    def context(self) -> Any:
        return task_context(self.task)

    def question(self) -> str:
        for key in ("question", "prompt"):
            value = self.task.get(key)
            if isinstance(value, str) and value.strip():
                return value
        raise ValueError("rlm_repl task needs a non-empty 'question' or 'prompt' string")

    def prompt_style(self) -> str:
        """``full`` or ``short``: the config's choice, or with ``auto`` the row's own (default full)."""
        if self.config.prompt_style != "auto":
            return self.config.prompt_style
        return "short" if self.task.get("prompt_style") == "short" else "full"

    def build_prompt(self) -> list[dict[str, str]]:
        limits = self.config.subcalls
        system = system_prompt(max_turns=self.max_turns, context=self.context, depth=self.depth,
                               max_depth=limits.max_depth, max_sub_calls=limits.max_sub_calls,
                               evidence_tools=task_has_papers(self.task), style=self.prompt_style())
        example = [dict(m) for m in WORKED_EXAMPLE] if self.config.worked_example else []
        return [{"role": "system", "content": system}, *example, {"role": "user", "content": self.question()}]

    def gold_actions(self) -> list[str] | None:
        if "solution" in self.task:
            return [f"```repl\n{self.task['solution']}\n```"]
        if "evidence" in self.task:
            return [f"```repl\nFINAL({list(self.task['evidence'])!r})\n```"]
        if "answer" in self.task:
            return [f"FINAL({str(self.task['answer'])!r})"]
        return None

    @classmethod
    def load_dataset(cls, split: str = "train", config: EnvConfig | None = None) -> Sequence[dict[str, Any]]:
        if split in STARTER_SPLITS:
            return starter_tasks(split)
        path = config.dataset_path if isinstance(config, RLMReplConfig) else None
        return load_tasks(path, split)

    # -- episodes --------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self._close_sandbox()
        self._reset_counters()
        return super().reset(seed=seed, options=options)

    def take_action(self, action: str) -> StepResult:
        return run_on_sandbox_loop_sync(self.atake_action(action))

    async def atake_action(self, action: str) -> StepResult:
        self._caller_loop = asyncio.get_running_loop()
        return await run_on_sandbox_loop(self._act(action))

    async def _act(self, action: str) -> StepResult:
        parsed = parse_response(action)
        shaping = 0.0
        outputs: list[str] = []
        answer: str | None = None
        ran = 0
        budget = _StepBudget(self.config.sandbox.exec_timeout_s, self.config.step_timeout_s)
        for index, code in enumerate(parsed.blocks):
            if budget.spent:
                outputs.append(f"[blocks {index + 1} to {len(parsed.blocks)} were not run: {budget.spent}]")
                break
            result = await self._execute(code, budget)
            ran += 1
            shaping += self._pay_block(result)
            if len(parsed.blocks) > 1:
                outputs.append(f"[block {index + 1} of {len(parsed.blocks)}]")
            outputs.append(self._describe(result))
            if result.final_answer is not None:
                answer = result.final_answer
                break
        if answer is None and parsed.final_var is not None and not budget.spent:
            # the model's FINAL_VAR text line, run for it: not a block of its own, so no block bonus
            result = await self._execute(f"FINAL_VAR({parsed.final_var!r})", budget)
            outputs.append(self._describe(result))
            answer = result.final_answer
        elif answer is None and parsed.final is not None:
            answer = parsed.final
            if len(answer) > self.config.sandbox.max_answer_chars:
                outputs.append(f"Error: the final answer has {len(answer):,} characters, over the limit of "
                               f"{self.config.sandbox.max_answer_chars:,}; it was not submitted.")
                answer = None
        info: dict[str, Any] = {"blocks_run": ran, "sandbox_backend": self.backend}
        if answer is not None:
            return await self._finish(answer, info, shaping)
        return StepResult([{"role": "user", "content": self._observation(parsed, outputs)}], shaping, False, False,
                          info)

    def _pay_block(self, result: ExecResult) -> float:
        """The block bonus, once per episode, for a block that ran to its end without an error."""
        if self._block_ran_clean or result.error is not None or result.timed_out:
            return 0.0
        self._block_ran_clean = True
        return self.config.format_reward.block_runs

    async def _finish(self, answer: str, info: dict[str, Any], shaping: float) -> StepResult:
        self.final_answer = answer
        # Scoring compares every snippet with every gold one: keep it off the shared sandbox loop.
        task_reward, components = await asyncio.to_thread(score_answer, self.task, self.context, answer,
                                                           self.config.match_threshold)
        shape = self.config.format_reward
        self.task_reward = task_reward
        reward = shaping + shape.final_called + shape.task_weight * task_reward
        components = {**components, "task_reward": task_reward}
        return StepResult([], reward, True, False, {**info, "final_answer": answer, "reward_components": components})

    def _observation(self, parsed: ParsedResponse, outputs: list[str]) -> str:
        parts = list(parsed.problems)
        if not parsed.blocks:
            self.counters["no_block_turns"] += 1
            parts.append("No ```repl block found. Put code between a line ```repl and a line ```, "
                         "or answer with a line FINAL(your answer).")
        parts += outputs
        left = self.max_turns - self.turn
        if left == 1:
            parts.append("You have 1 response left: it must give the final answer with FINAL(...) or FINAL_VAR(...).")
        elif left > 1:
            parts.append(f"You have {left} responses left.")
        return "\n".join(parts)

    def _describe(self, result: ExecResult) -> str:
        """The output the model sees for one execution, cut to ``max_output_chars`` with a note."""
        text = result.stdout
        if result.stderr:
            text += ("\n" if text and not text.endswith("\n") else "") + result.stderr
        if result.error:
            text += ("\n" if text and not text.endswith("\n") else "") + result.error
        notes = []
        if result.sandbox_restarted and not result.error:  # otherwise the error already says so
            notes.append("[the REPL was restarted: variables from earlier turns are gone]")
        limit = self.config.max_output_chars
        cut = result.truncated_chars + max(0, len(text) - limit)
        text = text[:limit]
        if cut:
            self.counters["output_chars_cut"] += cut
            notes.append(f"[output truncated: {cut:,} more characters were not shown]")
        body = text.rstrip("\n") if text.strip() else "(no output)"
        return "\n".join([body, *notes])

    async def _execute(self, code: str, budget: _StepBudget) -> ExecResult:
        if self._sandbox is None:
            self._sandbox = await Sandbox.create(
                self.config.sandbox, context=self.context, scaffold_code=evidence_scaffold(),
                rpc_methods=SUBCALL_METHODS, handler=self._handle_subcall)
            self.backend = self._sandbox.backend
        result = await self._sandbox.execute(code, timeout_s=budget.code_s_left, deadline=budget.deadline)
        budget.charge(result)
        self.counters["executions"] += 1
        self.counters["sandbox_errors"] += result.error is not None
        self.counters["sandbox_timeouts"] += bool(result.timed_out)
        self.counters["sandbox_restarts"] += bool(result.sandbox_restarted)
        return result

    async def _handle_subcall(self, method: str, params: dict[str, Any]) -> Any:
        """Runs on the sandbox loop; the injected handler runs on the loop that stepped the env."""
        self.counters["subcall_requests"] += 1
        handler, loop = self.subcall_handler, self._caller_loop
        prompts = params.get("prompts")
        limit = self.config.subcalls.max_batch_size
        if isinstance(prompts, (list, tuple)) and len(prompts) > limit:
            # One string, not one per prompt: the reply must not grow with what the code sent.
            return f"Error: {method} refused: {len(prompts)} prompts in one call; max_batch_size={limit}."
        try:
            if loop is None or loop is asyncio.get_running_loop() or loop.is_closed():
                return await handler(method, params)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(handler(method, params), loop))
        except Exception as exc:  # noqa: BLE001 - a failing sub-call is an answer to the code, not a crash
            log.warning("sub-call %s failed", method, exc_info=True)
            return f"Error: {method} failed: {type(exc).__name__}: {exc}"

    # -- metrics and cleanup -----------------------------------------------------------------

    def _format_reward(self) -> float:
        """The shaping this episode earned (see :meth:`_pay_block` and :meth:`_finish`)."""
        shape = self.config.format_reward
        return shape.block_runs * self._block_ran_clean + shape.final_called * (self.final_answer is not None)

    def get_metrics(self) -> dict[str, float]:
        return {**{k: float(v) for k, v in self.counters.items()}, "turns_used": float(self.turn),
                "task_reward": self.task_reward, "format_reward": self._format_reward(),
                "final_answer_given": float(self.final_answer is not None), "depth": float(self.depth),
                "sandbox_strong": float(self.backend in strong_names())}

    def close(self) -> None:
        self._close_sandbox()
        super().close()

    def _close_sandbox(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        try:
            run_on_sandbox_loop_sync(sandbox.close(), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the sandbox cleans itself up when its owner is gone
            log.warning("closing the sandbox failed", exc_info=True)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the task and config only (for remote workers); the sandbox never travels."""
        state = dict(self.__dict__)
        state.update(_sandbox=None, _caller_loop=None, subcall_handler=no_subcalls)
        return state
