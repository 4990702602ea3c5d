"""Generator ``rlm_tree``: root episodes plus the child episodes their code asks for.

Every root episode gets a :class:`~skyrl_rlm_repl.budget.RolloutBudget` shared with all its
descendants. Inside the REPL, ``rlm_query(prompt, context)`` plays a child episode (its own REPL,
task = the sub-prompt over that context) and returns the child's final answer; ``llm_query``
is one plain completion. Both run on the policy engine, or on ``sub_engine`` when configured.
Child trajectories follow all roots in the batch (depth-first, in call order); each has
``parent_id``/``depth`` set, the root's ``group_id`` and ``sample_index``, and
``task["rlm"]["root_id"]``, so a trainer can give it the root's advantage, its own, or drop it.
Children played by a frozen ``sub_engine`` are tool results only and are not in the batch.

Sampling seeds follow the tree, not the order requests arrive: a root's key is
``"<group id>/<sample>"``, its ``k``-th child's ``"<parent key>/c<k>"`` and the completion of its
``n``-th sub-call ``"<parent key>/q<n>"``; every engine request gets
:func:`~skyrl_core.generator.request_seed` of the batch seed and its key plus turn.
"""

from __future__ import annotations

import ast
import asyncio
import contextvars
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, field_validator
from skyrl_core import GeneratorConfig, MultiTurnGenerator, Trajectory, TrajectoryBatch
from skyrl_core.chat import ChatTokenizer
from skyrl_core.engine import GenerateOutput, InferenceEngine, SamplingParams
from skyrl_core.env import EnvConfig, EpisodeEnv
from skyrl_core.env_pool import WORKER_LOST
from skyrl_core.factory import ConfigError, component_config
from skyrl_core.plugins import get_plugin_manager, get_registry

from skyrl_rlm_repl.budget import RolloutBudget, TokenBudgetExhausted
from skyrl_rlm_repl.config import SubcallLimits
from skyrl_rlm_repl.env import task_context, task_has_papers
from skyrl_rlm_repl.evidence.judge import EvidenceJudge
from skyrl_rlm_repl.evidence.reward import SourceIndex, parse_snippets
from skyrl_rlm_repl.subcalls import SubcallError, SubcallHandler, SubcallRequest, parse_request
from skyrl_rlm_repl.tree_metrics import tree_metrics
from skyrl_rlm_repl.tree_node import TreeNode


class RLMTreeConfig(GeneratorConfig):
    """Options of generator ``rlm_tree``; sub-call limits live in the env config (``env.subcalls``)."""

    max_context_length: int = Field(8192, ge=8, description="Prompt + response never exceeds this (REPL "
                                                            "transcripts grow fast, hence more than 'default').")

    sub_engine: dict[str, Any] | None = Field(
        None, description="Frozen engine for llm_query and child episodes, as an engine section, e.g. "
                          "{id: openai, base_url: ..., model: ...}; None: the policy engine.")
    llm_query_max_tokens: int = Field(256, ge=1, description="Generation cap of one llm_query completion.")
    judge_engine: dict[str, Any] | None = Field(
        None, description="Chat engine section (e.g. {id: openai, ...}) of an LLM judge for evidence answers; "
                          "None: the reward is the snippet F1 alone.")
    judge_weight: float = Field(0.5, ge=0.0, le=1.0, description="Root reward = (1 - w) * F1 + w * judge score.")

    @field_validator("sub_engine", "judge_engine")
    @classmethod
    def _has_id(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and "id" not in value:
            raise ValueError("an engine section needs an 'id' (an engine id such as 'openai', see `skyrl engines`)")
        return value


_NODE: contextvars.ContextVar[TreeNode | None] = contextvars.ContextVar("rlm_tree_node", default=None)
_TREES: contextvars.ContextVar[list[TreeNode] | None] = contextvars.ContextVar("rlm_tree_roots", default=None)


class BudgetedEngine:
    """Charges every generation to the rollout tree of the episode that asks (cap = tokens left)."""

    def __init__(self, inner: InferenceEngine) -> None:
        self.inner = inner

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        node = _NODE.get()
        if node is None:
            return await self.inner.generate(prompt_ids, params)
        params = params.model_copy(update={"max_tokens": node.budget.cap(params.max_tokens)})
        out = await self.inner.generate(prompt_ids, params)
        node.budget.charge(len(out.token_ids))
        return out

    async def update_weights(self, named_tensors: Any) -> None:
        await self.inner.update_weights(named_tensors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RLMTreeGenerator(MultiTurnGenerator):
    """Tree rollouts for env ``rlm_repl`` (or any env whose config has ``subcalls`` limits)."""

    config: RLMTreeConfig

    def __init__(self, config: GeneratorConfig, *, engine: InferenceEngine, tokenizer: ChatTokenizer,
                 env_id: str, env_config: EnvConfig | Mapping[str, Any] | None = None) -> None:
        if not isinstance(config, RLMTreeConfig):
            config = RLMTreeConfig(**config.model_dump())
        super().__init__(config, engine=BudgetedEngine(engine), tokenizer=tokenizer, env_id=env_id,
                         env_config=env_config)
        limits = getattr(self.env_config, "subcalls", None)
        if not isinstance(limits, SubcallLimits):
            raise ConfigError(f"generator rlm_tree needs an env whose config has 'subcalls' limits "
                              f"(env rlm_repl); env {env_id!r} has none")
        self.limits = limits
        self.judge = EvidenceJudge(make_engine(config.judge_engine)) if config.judge_engine is not None else None
        self.sub_runner: RLMTreeGenerator | None = None
        if config.sub_engine is not None:
            sub = make_engine(config.sub_engine)
            self.sub_runner = RLMTreeGenerator(
                config.model_copy(update={"sub_engine": None, "judge_engine": None}), engine=sub,
                tokenizer=getattr(sub, "tokenizer", None) or tokenizer, env_id=env_id, env_config=self.env_config)
            self.sub_runner.sub_runner = self.sub_runner

    def close(self) -> None:
        super().close()
        if self.sub_runner is not None and self.sub_runner is not self:
            self.sub_runner.close()

    # -- batches -------------------------------------------------------------------------------

    async def generate(self, tasks: Sequence[Mapping[str, Any]], n_samples: int | None = None, *,
                       seed: int | None = None) -> TrajectoryBatch:
        """Roots in input order (as the default generator), then every trained child trajectory."""
        trees: list[TreeNode] = []
        token = _TREES.set(trees)
        try:
            batch = await super().generate(tasks, n_samples, seed=seed)
        finally:
            _TREES.reset(token)
        order = {str(task.get("id", index)): index for index, task in enumerate(tasks)}
        trees.sort(key=lambda n: (order.get(n.trajectory.group_id, len(order)), n.trajectory.sample_index))
        trees = [root for root in trees if root.trajectory.stop_reason != WORKER_LOST]  # lost tries: never trained
        for root in trees:
            for child in root.descendants():
                if not child.frozen:
                    batch.trajectories.extend(self.training_samples(child.trajectory))
        batch.metrics.update(tree_metrics(trees))
        return batch

    async def run_episode(self, trajectory: Trajectory) -> Trajectory:
        node = _NODE.get()
        if node is None or node.trajectory is not trajectory:
            node = TreeNode(trajectory, RolloutBudget(self.limits), root_id=trajectory.id,
                            key=super().episode_key(trajectory))
            trees = _TREES.get()
            if trees is not None:
                trees.append(node)
        token = _NODE.set(node)
        try:
            await super().run_episode(trajectory)
        finally:
            _NODE.reset(token)
        if node.root_id == trajectory.id:
            trajectory.metrics.update(_tree_totals(node))
            if self.judge is not None:
                await self._judge(trajectory)
        return trajectory

    def episode_key(self, trajectory: Trajectory) -> str:
        node = _NODE.get()
        if node is not None and node.trajectory is trajectory and node.key:
            return node.key
        return super().episode_key(trajectory)

    async def _judge(self, trajectory: Trajectory) -> None:
        """Mix the judge's score into the final reward of an evidence episode that gave an answer."""
        task = trajectory.task
        last = trajectory.turns[-1] if trajectory.turns else None
        if self.judge is None or last is None or "final_answer" not in last.info or "evidence" not in task:
            return
        source = SourceIndex(task_context(task))
        grounded = [s for s in parse_snippets(last.info["final_answer"]) if source.contains(s)]
        score = await self.judge.score(str(task.get("question", "")), list(task["evidence"]), grounded)
        if score is None:
            trajectory.metrics["judge_failed"] = 1.0
            return
        weight = self.config.judge_weight
        last.reward = (1 - weight) * last.reward + weight * score
        last.info.setdefault("reward_components", {})["judge"] = score
        trajectory.reward = sum(t.reward for t in trajectory.turns)
        trajectory.metrics["judge_score"] = score

    def new_env(self, task: Mapping[str, Any]) -> EpisodeEnv:
        env = super().new_env(task)
        node = _NODE.get()
        if node is not None:
            env.subcall_handler = self.subcall_handler(node)  # type: ignore[attr-defined]
            node.context = task_context(task)
        return env

    # -- sub-calls -----------------------------------------------------------------------------

    def subcall_handler(self, node: TreeNode) -> SubcallHandler:
        """The handler the REPL of ``node`` sends its sub-calls to."""

        async def handle(method: str, params: dict[str, Any]) -> Any:
            try:
                request = parse_request(method, params)
            except SubcallError as exc:
                return f"Error: {exc}"
            answers = await asyncio.gather(*(self._one(node, request, prompt, context)
                                             for prompt, context in zip(request.prompts, request.contexts, strict=True)))
            return request.reply(answers)

        return handle

    async def _one(self, node: TreeNode, request: SubcallRequest, prompt: str, context: Any) -> Any:
        node.sub_calls += 1
        key = f"{node.key}/q{node.sub_calls}"  # taken before any await: call order, not completion order
        size = len(prompt) + (len(json.dumps(context, default=str)) if context is not None else 0)
        if size > self.limits.max_prompt_chars:
            node.budget.refusals += 1
            return (f"Error: {request.method} refused: prompt and context hold {size:,} characters; "
                    f"max_prompt_chars={self.limits.max_prompt_chars:,}.")
        refusal = node.budget.refusal(request.method, node.depth)
        if refusal is not None:
            return refusal
        runner = self.sub_runner or self
        if request.recursive:
            return await self._child(runner, node, prompt, node.context if context is None else context)
        return await runner._complete(node, prompt, key)

    async def _complete(self, node: TreeNode, prompt: str, key: str | None = None) -> str:
        """``llm_query``: one completion of ``prompt`` as a single user message, seeded from ``key``
        (default: the node's key and its sub-call count)."""
        ids = self.renderer.prompt_ids([{"role": "user", "content": prompt}])
        room = self.config.max_context_length - len(ids)
        if room <= 0:
            return (f"Error: llm_query refused: the prompt has {len(ids)} tokens; "
                    f"max_context_length={self.config.max_context_length}.")
        token = _NODE.set(node)
        try:
            params = self.sampling_params(min(self.config.llm_query_max_tokens, room),
                                          seed=self.request_seed(key or f"{node.key}/q{node.sub_calls}"))
            out = await self.engine.generate(ids, params)
        except TokenBudgetExhausted as exc:
            return f"Error: llm_query refused: {exc}."
        except Exception as exc:  # noqa: BLE001 - the calling code gets the failure as text
            return f"Error: llm_query failed: {type(exc).__name__}: {exc}"
        finally:
            _NODE.reset(token)
        return self.tokenizer.decode(out.token_ids, skip_special_tokens=True)

    async def _child(self, runner: RLMTreeGenerator, parent: TreeNode, prompt: str, context: Any) -> Any:
        """``rlm_query``: play a child episode on ``runner`` and return its final answer."""
        depth = parent.depth + 1
        index = len(parent.children)  # assigned in call order, before any await
        task = {"prompt": prompt, "context": context,
                "rlm": {"depth": depth, "parent_id": parent.trajectory.id, "root_id": parent.root_id,
                        "child_index": index, "papers": task_has_papers(parent.trajectory.task)}}
        trajectory = Trajectory(parent_id=parent.trajectory.id, depth=depth, group_id=parent.trajectory.group_id,
                                sample_index=parent.trajectory.sample_index, env_id=self.env_id, task=task)
        child = TreeNode(trajectory, parent.budget, parent.root_id, frozen=parent.frozen or runner is not self,
                         key=f"{parent.key}/c{index}")
        parent.children.append(child)
        async with parent.budget.child_slot(depth):
            token = _NODE.set(child)
            try:
                await runner.run_episode(trajectory)
            finally:
                _NODE.reset(token)
        get_plugin_manager().hook.on_rollout_end(trajectory=trajectory)
        return child_answer(trajectory)


def child_answer(trajectory: Trajectory) -> Any:
    """A child's FINAL answer (a list when it is a list literal), or an error string saying why there is none."""
    last = trajectory.turns[-1].info if trajectory.turns else {}
    answer = last.get("final_answer")
    if answer is None:
        why = trajectory.error or trajectory.stop_reason
        return f"Error: rlm_query child ended without a final answer ({why})."
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(answer)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, list):
            return value
    return answer


def _tree_totals(root: TreeNode) -> dict[str, float]:
    nodes = [root, *root.descendants()]
    return {"tree_episodes": float(len(nodes)), "tree_depth_reached": float(max(n.depth for n in nodes)),
            "tree_sub_calls": float(root.budget.sub_calls), "tree_tokens": float(root.budget.tokens),
            "tree_refusals": float(root.budget.refusals)}


def make_engine(section: Mapping[str, Any]) -> InferenceEngine:
    """Build an engine from a config section ``{id: ..., **options}``."""
    options = dict(section)
    engine_id = str(options.pop("id"))
    registry = get_registry()
    config = component_config("engine", engine_id, options, registry)
    cls = registry.get("engine", engine_id).load()
    return cls(config) if config is not None else cls()
