"""Generator rlm_tree with a scripted policy: tree links, batch layout, limits, metrics, no deadlock."""

from __future__ import annotations

import asyncio

import pytest
from rlm_helpers import CONTEXT_TASK, repl, scripted_policy
from skyrl_core.factory import ConfigError
from skyrl_rlm_repl.tree import RLMTreeConfig, RLMTreeGenerator, child_answer

CHILD_ANSWER = repl("FINAL(['Notes: the capital of France is Paris.'])")


def make_generator(tokenizer, choose, *, env=None, **config):
    options = {"n_samples_per_prompt": 1, "max_tokens_per_turn": 200, "max_context_length": 6000,
               "max_total_tokens": 3000, **config}
    return RLMTreeGenerator(RLMTreeConfig(**options), engine=scripted_policy(tokenizer, choose), tokenizer=tokenizer,
                            env_id="rlm_repl", env_config={"max_turns": 3, **(env or {})})


def coordinator(code: str, child_reply: str = CHILD_ANSWER):
    """Roots run ``code`` then FINAL the variable ``out``; children (prompts starting CHILD) answer at once."""

    def choose(first_user: str, last_user: str, turn: int) -> str:
        if first_user.startswith("CHILD"):
            return child_reply
        return repl(code) if turn == 0 else repl("FINAL_VAR('out')")

    return choose


def observations(trajectory):
    return "\n".join(m["content"] for turn in trajectory.turns for m in turn.observation)


async def test_children_link_to_their_root_and_follow_all_roots_in_the_batch(tokenizer):
    gen = make_generator(tokenizer, coordinator("out = rlm_query_batched(['CHILD a', 'CHILD b'])\nprint(out)"))
    tasks = [{**CONTEXT_TASK, "id": "t1"}, {**CONTEXT_TASK, "id": "t2"}]
    batch = await gen.generate(tasks, n_samples=2)
    roots, children = batch.trajectories[:4], batch.trajectories[4:]
    assert [(r.group_id, r.sample_index, r.parent_id) for r in roots] == [
        ("t1", 0, None), ("t1", 1, None), ("t2", 0, None), ("t2", 1, None)]
    assert len(children) == 8
    for index, child in enumerate(children):
        root = roots[index // 2]
        assert (child.parent_id, child.depth, child.group_id, child.sample_index) == (
            root.id, 1, root.group_id, root.sample_index)
        assert child.task["rlm"] == {"depth": 1, "parent_id": root.id, "root_id": root.id,
                                     "child_index": index % 2, "papers": False}
        assert child.task["prompt"] == ("CHILD a", "CHILD b")[index % 2]
        assert child.stop_reason == "terminated" and child.reward == 1.0  # its snippet is grounded
        assert sum(child.loss_mask) > 0 and child.error is None
    # The root's code received the children's list answers, in order.
    assert "[['Notes: the capital of France is Paris.'], ['Notes: the capital" in observations(roots[0])
    assert batch.children_of(roots[0].id) == children[:2]


async def test_step_wise_children_are_split_and_point_to_the_parent_episode(tokenizer):
    gen = make_generator(tokenizer, coordinator("out = rlm_query('CHILD a')"), step_wise=True)
    batch = await gen.generate([CONTEXT_TASK])
    root_steps = [t for t in batch if t.depth == 0]
    child_steps = [t for t in batch if t.depth == 1]
    assert [t.step_index for t in root_steps] == [0, 1] and len(child_steps) == 1
    assert child_steps[0].parent_id == root_steps[0].id.rsplit("-s", 1)[0]
    assert child_steps[0].id.endswith("-s0") and child_steps[0].is_last_step


async def test_llm_query_is_a_plain_completion_on_the_policy(tokenizer):
    def choose(first_user, last_user, turn):
        if first_user == "say hi":
            return "hi there"
        return repl("out = llm_query('say hi')", "print(out)") if turn == 0 else repl("FINAL_VAR('out')")

    batch = await make_generator(tokenizer, choose).generate([CONTEXT_TASK])
    assert len(batch) == 1  # llm_query completions are not episodes
    root = batch.trajectories[0]
    assert "hi there" in observations(root) and root.turns[-1].info["final_answer"] == "hi there"
    assert batch.metrics["rlm/depth0/sub_calls"] == 1.0 and "rlm/depth1/episodes" not in batch.metrics


async def test_depth_limit_allows_grandchildren_up_to_max_depth_only(tokenizer):
    def choose(first_user, last_user, turn):
        if first_user.startswith("GRAND"):
            return repl("FINAL(rlm_query('too deep'))")
        if first_user.startswith("CHILD"):
            return repl("FINAL(rlm_query('GRAND x'))")
        return repl("out = rlm_query('CHILD a')", "print(out)") if turn == 0 else repl("FINAL_VAR('out')")

    gen = make_generator(tokenizer, choose, env={"subcalls": {"max_depth": 2}})
    batch = await gen.generate([CONTEXT_TASK])
    depths = [t.depth for t in batch]
    assert depths == [0, 1, 2]
    root, child, grandchild = batch.trajectories
    assert grandchild.parent_id == child.id and grandchild.task["rlm"]["root_id"] == root.id
    refusal = "Error: rlm_query refused: max_depth=2 reached: this REPL is at depth 2"
    assert grandchild.turns[-1].info["final_answer"].startswith(refusal)
    assert batch.metrics["rlm/depth_reached_max"] == 2.0 and batch.metrics["rlm/refusals"] == 1.0
    assert root.metrics["tree_episodes"] == 3.0 and root.metrics["tree_depth_reached"] == 2.0


@pytest.mark.parametrize(("env", "code", "expected"), [
    ({"subcalls": {"max_depth": 0}}, "out = rlm_query('CHILD a')",
     "Error: rlm_query refused: max_depth=0 reached: this REPL is at depth 0"),
    ({"subcalls": {"max_sub_calls": 1}}, "out = rlm_query_batched(['CHILD a', 'CHILD b'])",
     "Error: rlm_query_batched refused: max_sub_calls=1 sub-calls per rollout are used up."),
    ({"subcalls": {"max_batch_size": 2}}, "out = llm_query_batched(['a', 'b', 'c'])",
     "Error: llm_query_batched refused: 3 prompts in one call; max_batch_size=2."),
    ({"subcalls": {"max_prompt_chars": 50}}, "out = llm_query('x' * 60)",
     "Error: llm_query refused: prompt and context hold 60 characters; max_prompt_chars=50."),
    ({}, "out = rlm_query_batched(['CHILD a', 'CHILD b'], context_list=['only one'])",
     "Error: rlm_query_batched: context_list must be a list with one entry per prompt (2 prompts, got 1 contexts)"),
    ({}, "out = llm_query(['not', 'a', 'string'])",
     "Error: llm_query(prompt): prompt must be a string, got list"),
])
async def test_limits_and_bad_calls_return_error_strings_to_the_code(tokenizer, env, code, expected):
    gen = make_generator(tokenizer, coordinator(code + "\nprint(out)"), env=env)
    batch = await gen.generate([CONTEXT_TASK])
    assert expected in observations(batch.trajectories[0])
    assert batch.trajectories[0].turns[-1].info["final_answer"]  # the root still answered


async def test_token_budget_is_shared_by_the_tree_and_refuses_further_calls(tokenizer):
    long_child = repl("FINAL('" + "word " * 120 + "')")
    gen = make_generator(tokenizer, coordinator("first = rlm_query('CHILD a')\nout = llm_query('more?')\nprint(out)",
                                                child_reply=long_child),
                         env={"subcalls": {"max_total_tokens": 400}})
    batch = await gen.generate([CONTEXT_TASK])
    root = batch.trajectories[0]
    assert "Error: llm_query refused: max_total_tokens=400 tokens per rollout are used up." in observations(root)
    assert root.metrics["tree_tokens"] >= 400


async def test_child_without_final_answer_reports_why(tokenizer):
    gen = make_generator(tokenizer, coordinator("out = rlm_query('CHILD a')\nprint(out)",
                                                child_reply=repl("print('thinking')")),
                         env={"max_turns": 2})
    batch = await gen.generate([CONTEXT_TASK])
    assert "Error: rlm_query child ended without a final answer (truncated)." in observations(batch.trajectories[0])
    assert batch.trajectories[1].stop_reason == "truncated"


async def test_per_depth_metrics_count_episodes_calls_rewards_and_sandbox_trouble(tokenizer):
    gen = make_generator(tokenizer, coordinator("out = rlm_query_batched(['CHILD a', 'CHILD b'])",
                                                child_reply=repl("1/0") + "\nFINAL(['made up'])"))
    batch = await gen.generate([CONTEXT_TASK], n_samples=2)
    m = batch.metrics
    assert m["rlm/depth0/episodes"] == 2.0 and m["rlm/depth1/episodes"] == 4.0
    assert m["rlm/depth0/sub_calls"] == 4.0 and m["rlm/depth1/sub_calls"] == 0.0
    assert m["rlm/depth1/sandbox_errors"] == 4.0 and m["rlm/depth1/reward_mean"] == 0.0  # ungrounded answers
    assert m["rlm/depth1/final_answer_rate"] == 1.0 and m["rlm/sub_calls_mean"] == 2.0


@pytest.mark.slow  # ~15 s
async def test_64_concurrent_roots_with_batched_children_finish_without_deadlock(tokenizer, evidence_tasks):
    code = ("ids = list(context)\n"
            "out = rlm_query_batched(['CHILD quote ' + i for i in ids[:2]], context_list=[context[i] for i in ids[:2]])")

    def choose(first_user, last_user, turn):
        if first_user.startswith("CHILD"):
            return repl("FINAL([h['text'] for h in search('the')][:1])")
        return repl(code) if turn == 0 else repl("FINAL([s for answer in out for s in answer])")

    gen = make_generator(tokenizer, choose, env={"subcalls": {"max_concurrent_children": 2}})
    batch = await asyncio.wait_for(gen.generate(evidence_tasks[:8], n_samples=8), timeout=600)
    roots = batch.roots()
    assert len(roots) == 64 and len(batch) == 64 + 128
    assert all(r.stop_reason == "terminated" and r.error is None for r in roots)
    root_ids = {r.id for r in roots}
    for child in batch.trajectories[64:]:
        assert child.parent_id in root_ids and child.depth == 1 and child.stop_reason == "terminated"
    assert all(len(batch.children_of(r.id)) == 2 for r in roots)
    assert batch.metrics["rlm/depth1/episodes"] == 128.0 and batch.metrics["rlm/depth1/reward_mean"] == 1.0


def test_child_answer_turns_list_literals_into_lists():
    from skyrl_core import Trajectory, Turn

    def ended(answer):
        return Trajectory(turns=[Turn(action="", observation=[], info={"final_answer": answer})])

    assert child_answer(ended("['a', 'b']")) == ["a", "b"]
    assert child_answer(ended("42")) == "42"
    assert child_answer(Trajectory(stop_reason="truncated")).startswith("Error: rlm_query child ended")


def test_env_without_subcall_limits_is_rejected(tokenizer):
    with pytest.raises(ConfigError, match="generator rlm_tree needs an env whose config has 'subcalls'"):
        RLMTreeGenerator(RLMTreeConfig(), engine=scripted_policy(tokenizer, lambda *a: ""), tokenizer=tokenizer,
                         env_id="reverse_text")


def test_sub_engine_section_needs_an_id():
    with pytest.raises(ValueError, match="an engine section needs an .id."):
        RLMTreeConfig(sub_engine={"base_url": "http://127.0.0.1:1"})


async def test_frozen_sub_engine_serves_llm_query_and_children_which_stay_out_of_the_batch(tokenizer):
    from rlm_openai_server import frozen_model_server

    def frozen(first_user, last_user, turn):
        return CHILD_ANSWER if first_user.startswith("CHILD") else "frozen says hi"

    policy = coordinator("out = [llm_query('hello'), rlm_query('CHILD a')]\nprint(out)")
    with frozen_model_server(tokenizer, frozen) as (base_url, seen):
        gen = make_generator(tokenizer, policy, sub_engine={"id": "openai", "base_url": base_url, "model": "frozen"})
        batch = await gen.generate([CONTEXT_TASK])
    assert [t.depth for t in batch] == [0]  # the frozen child played, but is not policy data
    root = batch.trajectories[0]
    assert "['frozen says hi', ['Notes: the capital of France is Paris.']]" in observations(root)
    assert len(seen) == 2 and any("CHILD a" in prompt for prompt in seen)
    assert len(gen.engine.inner.calls) == 2  # the policy played only the root's two turns
    assert batch.metrics["rlm/depth1/episodes"] == 1.0 and batch.metrics["rlm/depth1/reward_mean"] == 1.0


@pytest.mark.parametrize(("judge_reply", "judged"), [("Mostly right.\nSCORE: 6", 0.6), ("I cannot grade this.", None)])
async def test_llm_judge_is_mixed_into_the_root_reward_and_never_sees_invented_quotes(tokenizer, evidence_tasks,
                                                                                      judge_reply, judged):
    from rlm_openai_server import frozen_model_server
    from skyrl_rlm_repl.evidence.reward import SourceIndex, score_evidence

    task = evidence_tasks[0]
    answer = [task["evidence"][0], "An invented quote that no paper holds."]
    f1 = score_evidence(answer, task["evidence"], SourceIndex(task["papers"])).f1
    policy = lambda first_user, last_user, turn: repl(f"FINAL({answer!r})")  # noqa: E731
    with frozen_model_server(tokenizer, policy, chat=lambda prompt: judge_reply) as (base_url, seen):
        gen = make_generator(tokenizer, policy, judge_engine={"id": "openai", "base_url": base_url, "model": "j"},
                             judge_weight=0.5)
        batch = await gen.generate([task])
    root = batch.trajectories[0]
    assert len(seen) == 1 and task["evidence"][0] in seen[0] and "invented quote" not in seen[0]
    if judged is None:
        assert root.reward == pytest.approx(f1) and batch.metrics["rlm/judge_failures"] == 1.0
    else:
        assert root.reward == pytest.approx(0.5 * f1 + 0.5 * judged)
        assert root.turns[-1].info["reward_components"]["judge"] == judged
        assert batch.metrics["rlm/judge_score_mean"] == judged and batch.metrics["rlm/judge_failures"] == 0.0


async def test_episode_that_spends_the_tree_budget_ends_trainable_with_stop_reason_token_budget(tokenizer):
    chatty = repl("print('" + "word " * 30 + "')")
    gen = make_generator(tokenizer, lambda first_user, last_user, turn: chatty,
                         env={"max_turns": 5, "subcalls": {"max_total_tokens": 60}})
    batch = await gen.generate([CONTEXT_TASK])
    root = batch.trajectories[0]
    assert root.stop_reason == "token_budget" and root.error is None and root.reward == 0.0
    assert sum(root.loss_mask) == 60 == root.metrics["tree_tokens"]  # capped exactly at the budget
    assert batch.metrics["rollout/errors"] == 0.0


@pytest.mark.parametrize("step_wise", [False, True])
async def test_trainer_credit_assignment_finds_each_childs_root(tokenizer, step_wise):
    credit = pytest.importorskip("skyrl_trainers.credit")
    root_answers = iter(["FINAL(Paris)", "FINAL(Lyon)"] * 2)  # two right, two wrong in one GRPO group
    child_answers = iter(["['Notes: the capital of France is Paris.']", "['invented']"] * 4)

    def choose(first_user, last_user, turn):
        if first_user.startswith("CHILD"):
            return repl(f"FINAL({next(child_answers)})")
        return repl("out = rlm_query_batched(['CHILD a', 'CHILD b'])") if turn == 0 else next(root_answers)

    batch = await make_generator(tokenizer, choose, step_wise=step_wise).generate([CONTEXT_TASK], n_samples=4)
    rows = batch.trajectories
    depth1 = [i for i, t in enumerate(rows) if t.depth == 1]
    assert len({credit.episode_key(rows[i]) for i in depth1}) == 8

    inherit = credit.assign_advantages(rows, child_advantage="inherit")
    root_advantage = {credit.episode_key(t): a for t, a in zip(rows, inherit, strict=True) if t.depth == 0}
    assert min(root_advantage.values()) < 0 < max(root_advantage.values())
    for i in depth1:
        assert inherit[i] == root_advantage[rows[i].task["rlm"]["root_id"]]
    excluded = credit.assign_advantages(rows, child_advantage="exclude")
    assert [i for i, a in enumerate(excluded) if a is None] == depth1
    own = credit.assign_advantages(rows, child_advantage="own")
    child_own = {credit.episode_key(rows[i]): own[i] for i in depth1}
    grounded = {credit.episode_key(rows[i]) for i in depth1 if rows[i].reward == 1.0}
    assert len(grounded) == 4 and all((child_own[k] > 0) == (k in grounded) for k in child_own)


@pytest.mark.parametrize("limit", [2, 4])
async def test_batched_children_run_concurrently_up_to_the_per_depth_limit(tokenizer, limit):
    in_flight = {"now": 0, "max": 0}
    gen = make_generator(tokenizer, coordinator("out = rlm_query_batched(['CHILD a', 'CHILD b', 'CHILD c', 'CHILD d'])"),
                         env={"subcalls": {"max_concurrent_children": limit}})
    policy = gen.engine.inner
    policy.latency = 0.3
    play = policy.generate

    async def counting(prompt_ids, params):
        child = "CHILD" in tokenizer.decode(prompt_ids).split("<|im_start|>user\n")[1]
        in_flight["now"] += child
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        try:
            return await play(prompt_ids, params)
        finally:
            in_flight["now"] -= child

    policy.generate = counting
    batch = await gen.generate([CONTEXT_TASK])
    assert len(batch.children_of(batch.trajectories[0].id)) == 4
    assert in_flight["max"] == limit


async def test_each_child_has_its_own_repl_and_the_context_it_was_given(tokenizer):
    def choose(first_user, last_user, turn):
        if first_user.startswith("CHILD"):
            return repl("FINAL(repr(('secret' in globals(), context)))")
        code = "secret = 1\nout = [rlm_query('CHILD given', context={'k': [1, 2]}), rlm_query('CHILD default')]"
        return repl(code) if turn == 0 else repl("FINAL_VAR('out')")

    batch = await make_generator(tokenizer, choose).generate([CONTEXT_TASK])
    answer = batch.trajectories[0].turns[-1].info["final_answer"]
    assert answer == repr(["(False, {'k': [1, 2]})", f"(False, {CONTEXT_TASK['context']!r})"])


class SeedPolicy:
    """A policy engine whose reply is ``choose(first_user, turn, seed)``; records ``(first_user, turn, seed)``
    of each request after a random delay (so requests arrive in a different order on every run)."""

    def __init__(self, tokenizer, choose):
        import random

        self.tokenizer, self.choose, self.random = tokenizer, choose, random.Random()
        self.requests = []

    async def generate(self, prompt_ids, params):
        from skyrl_core.testing.scripted_engine import ScriptedEngine

        await asyncio.sleep(self.random.random() * 0.003)
        text = self.tokenizer.decode(prompt_ids)
        first_user = text.split("<|im_start|>user\n")[1].split("<|im_end|>", 1)[0]
        turn = text.count("<|im_start|>assistant\n") - 1
        self.requests.append((first_user, turn, params.seed))
        reply = self.choose(first_user, turn, params.seed)
        return await ScriptedEngine(self.tokenizer, [reply]).generate(prompt_ids, params)

    async def update_weights(self, named_tensors):
        pass


def seeded_tree_policy(first_user, turn, seed):
    """Roots: two children (the first has a grandchild) and an llm_query; answers carry the request's seed."""
    if first_user.startswith("GRAND"):
        return repl(f"FINAL('grand {seed % 1000}')")
    if first_user.startswith("CHILD a"):
        return repl("FINAL(rlm_query('GRAND x') + ' via a')")
    if first_user.startswith("CHILD"):
        return repl(f"FINAL('b {seed % 1000}')")
    if first_user == "say hi":
        return f"hi {seed % 1000}"
    if turn == 0:
        return repl("out = rlm_query_batched(['CHILD a', 'CHILD b']) + [llm_query('say hi')]", "print(out)")
    return repl("FINAL_VAR('out')")


def tree_keys(task_ids, samples):
    return [f"{t}/{s}/{k}" for t in task_ids for s in range(samples)
            for k in ("t0", "t1", "c0/t0", "c0/c0/t0", "c1/t0", "q3")]


async def seeded_tree_rollout(tokenizer, seed, *, sub_engine=False):
    from skyrl_rlm_repl.tree import BudgetedEngine

    policy = SeedPolicy(tokenizer, seeded_tree_policy)
    options = {"n_samples_per_prompt": 2, "max_tokens_per_turn": 200, "max_context_length": 6000,
               "max_total_tokens": 3000}
    env = {"max_turns": 3, "subcalls": {"max_depth": 2}}
    gen = RLMTreeGenerator(RLMTreeConfig(**options), engine=policy, tokenizer=tokenizer, env_id="rlm_repl",
                           env_config=env)
    sub = None
    if sub_engine:  # what RLMTreeGenerator builds for a configured sub_engine, on a recording engine
        sub = SeedPolicy(tokenizer, seeded_tree_policy)
        gen.sub_runner = RLMTreeGenerator(RLMTreeConfig(**options), engine=sub, tokenizer=tokenizer,
                                          env_id="rlm_repl", env_config=gen.env_config)
        gen.sub_runner.sub_runner = gen.sub_runner
        assert isinstance(gen.sub_runner.engine, BudgetedEngine)
    tasks = [{**CONTEXT_TASK, "id": "t1"}, {**CONTEXT_TASK, "id": "t2"}]
    batch = await gen.generate(tasks, seed=seed)
    return batch, policy, sub


def tree_record(batch):
    return [(t.group_id, t.sample_index, t.depth, t.task.get("prompt"), t.response_ids, t.reward, t.stop_reason)
            for t in batch]


async def test_tree_rollouts_are_seeded_by_tree_position_and_replay_per_seed(tokenizer):
    from skyrl_core.generator import request_seed

    first, policy1, _ = await seeded_tree_rollout(tokenizer, seed=5)
    second, policy2, _ = await seeded_tree_rollout(tokenizer, seed=5)
    assert [t.depth for t in first] == [0] * 4 + [1, 2, 1] * 4
    assert all(t.error is None and t.stop_reason == "terminated" for t in first)
    assert tree_record(first) == tree_record(second)
    # requests arrived in another (random) order, with the same seeds
    assert sorted(policy1.requests) == sorted(policy2.requests)
    seeds = [seed for _, _, seed in policy1.requests]
    assert sorted(seeds) == sorted(request_seed(5, key) for key in tree_keys(["t1", "t2"], 2))
    root = first.trajectories[0]
    assert f"hi {request_seed(5, 't1/0/q3') % 1000}" in observations(root)
    assert f"grand {request_seed(5, 't1/0/c0/c0/t0') % 1000} via a" in observations(root)

    other, _, _ = await seeded_tree_rollout(tokenizer, seed=6)
    assert tree_record(other) != tree_record(first)


async def test_sub_engine_requests_are_seeded_by_tree_position_too(tokenizer):
    from skyrl_core.generator import request_seed

    batch, policy, sub = await seeded_tree_rollout(tokenizer, seed=5, sub_engine=True)
    assert [t.depth for t in batch] == [0] * 4  # frozen children are not in the batch
    keys = tree_keys(["t1", "t2"], 2)
    assert sorted(s for _, _, s in policy.requests) == sorted(
        request_seed(5, k) for k in keys if k.split("/", 2)[2] in ("t0", "t1"))
    assert sorted(s for _, _, s in sub.requests) == sorted(
        request_seed(5, k) for k in keys if k.split("/", 2)[2] not in ("t0", "t1"))
    again, _, _ = await seeded_tree_rollout(tokenizer, seed=5, sub_engine=True)
    assert tree_record(batch) == tree_record(again)
