"""The default generator: token-exact multi-turn rollouts, budgets, groups, step-wise, isolation."""

from __future__ import annotations

import pytest
from core_envs import TestEnvsPlugin
from skyrl_core.chat import ChatRenderer, render_ids
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator


@pytest.fixture
def test_envs(register_skyrl_plugin):
    register_skyrl_plugin(TestEnvsPlugin())


def make_generator(engine, env_id="reverse_text", **config):
    return MultiTurnGenerator(GeneratorConfig(**{"n_samples_per_prompt": 1, **config}), engine=engine,
                              tokenizer=engine.tokenizer, env_id=env_id)


@pytest.mark.parametrize("style", ["chatml", "llama3"])
async def test_three_turn_episode_is_token_exact(scripted_engine, style):
    # Three turns: malformed (feedback), wrong with a 3-character right prefix (feedback), correct. Only the
    # turn that ends the episode pays (the tutorial env keeps its summed reward in its range).
    engine = scripted_engine("no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>", style=style)
    gen = make_generator(engine, max_turns=3)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert traj.error is None and traj.stop_reason == "terminated"
    assert len(traj.turns) == 3 and [t.reward for t in traj.turns] == [0.0, 0.0, 1.0]

    tok = engine.tokenizer
    renderer = ChatRenderer(tok)
    # The generated ids are exactly what the engine returned, in order, with mask 1.
    generated = [i for i, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m == 1]
    expected_generated = [t for out in engine_outputs(engine, tok) for t in out]
    assert generated == expected_generated
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 0)
    assert all(lp == -0.25 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 1)
    # A full re-render of the conversation equals prompt + response (plus the template's turn trailer).
    full = render_ids(tok, traj.messages, add_generation_prompt=False)
    assert traj.prompt_ids + traj.response_ids + renderer.turn_trailer == full
    # Mask runs: generated, observation, generated, observation, generated.
    runs = [m for i, m in enumerate(traj.loss_mask) if i == 0 or traj.loss_mask[i - 1] != m]
    assert runs == [1, 0, 1, 0, 1]


def engine_outputs(engine, tok):
    texts = ["no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>"]
    return [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in texts]


async def test_observation_tokens_render_like_the_template(scripted_engine):
    engine = scripted_engine(style="chatml")
    renderer = ChatRenderer(engine.tokenizer)
    obs = renderer.observation_ids([{"role": "user", "content": "hi"}], ended_with_end_of_turn=True)
    assert engine.tokenizer.decode(obs) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cut = renderer.observation_ids([{"role": "user", "content": "hi"}], ended_with_end_of_turn=False)
    assert cut[0] == renderer.end_of_turn_id and cut[1:] == obs


async def test_per_turn_budget_cuts_generation_and_marks_length(scripted_engine):
    engine = scripted_engine(default="<answer>" + "z" * 200 + "</answer>")
    gen = make_generator(engine, max_turns=2, max_tokens_per_turn=7, max_total_tokens=100)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert [t.generated_tokens for t in traj.turns] == [7, 7]
    assert all(t.engine_stop_reason == "length" for t in traj.turns)
    # A cut turn is closed with the end-of-turn token as an observation token (mask 0).
    first_obs = traj.response_ids[7]
    assert first_obs == ChatRenderer(engine.tokenizer).end_of_turn_id and traj.loss_mask[7] == 0


async def test_total_token_budget_stops_the_episode(scripted_engine):
    engine = scripted_engine(default="<answer>nope</answer>")
    gen = make_generator(engine, max_turns=10, max_tokens_per_turn=50, max_total_tokens=12)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert sum(traj.loss_mask) <= 12
    assert traj.stop_reason == "token_budget"


@pytest.mark.parametrize("limit", [90, 100, 115, 140])
async def test_context_length_is_never_exceeded(scripted_engine, limit):
    engine = scripted_engine(default="<answer>not the reversed text at all</answer>")
    gen = make_generator(engine, max_turns=10, max_tokens_per_turn=64, max_context_length=limit)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert len(traj.prompt_ids) + len(traj.response_ids) <= limit
    assert all(len(call) < limit for call in engine.calls)
    assert traj.stop_reason in {"context_length", "truncated"}


async def test_prompt_longer_than_context_is_reported(scripted_engine):
    engine = scripted_engine(default="x")
    gen = make_generator(engine, max_context_length=10)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert traj.stop_reason == "prompt_too_long" and "max_context_length is 10" in traj.error
    assert traj.response_ids == [] and engine.calls == []


async def test_turn_limit_truncates(scripted_engine):
    engine = scripted_engine(default="no tags")
    gen = make_generator(engine, max_turns=3)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert len(traj.turns) == 3 and traj.stop_reason == "truncated"
    assert "turn limit (3)" in traj.turns[-1].info["truncated_reason"]


async def test_groups_have_n_samples_in_input_order(scripted_engine):
    engine = scripted_engine(default="<answer>x</answer>")
    gen = make_generator(engine, n_samples_per_prompt=3, max_turns=1)
    batch = await gen.generate([{"id": "a", "text": "apple"}, {"id": "b", "text": "river"}])
    assert [(t.group_id, t.sample_index) for t in batch] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert len({t.id for t in batch}) == 6
    assert batch.metrics["rollout/episodes"] == 6.0


async def test_step_wise_mode_emits_one_sample_per_turn(scripted_engine):
    engine = scripted_engine("no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>")
    episode_gen = make_generator(engine, max_turns=3)
    (episode,) = (await episode_gen.generate([{"text": "apple"}])).trajectories
    engine.enqueue("no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>")
    steps = (await make_generator(engine, max_turns=3, step_wise=True).generate([{"text": "apple"}])).trajectories
    assert [s.step_index for s in steps] == [0, 1, 2] and [s.is_last_step for s in steps] == [False, False, True]
    assert all(s.reward == episode.reward for s in steps)
    for step in steps:
        assert all(m == 1 for m in step.loss_mask) and step.response_ids
        # Each step's prompt + response is a prefix of the whole episode's token sequence.
        whole = episode.prompt_ids + episode.response_ids
        assert whole[: len(step.prompt_ids) + len(step.response_ids)] == step.prompt_ids + step.response_ids


async def test_a_crashing_env_fails_only_its_own_episode(scripted_engine, test_envs):
    engine = scripted_engine(default="done")
    gen = make_generator(engine, env_id="crashing", max_turns=2)
    tasks = [{"id": str(i), "n": i, "crash": i == 7} for i in range(16)]
    batch = await gen.generate(tasks)
    finished = [t for t in batch if t.error is None]
    failed = [t for t in batch if t.error is not None]
    assert len(finished) == 15 and all(t.stop_reason == "terminated" and t.reward == 1.0 for t in finished)
    assert len(failed) == 1 and failed[0].group_id == "7" and "database unavailable" in failed[0].error
    assert batch.metrics["rollout/errors"] == 1.0


async def test_engine_failure_is_isolated(scripted_engine):
    engine = scripted_engine(default=lambda ids: (_ for _ in ()).throw(ConnectionError("engine down")))
    gen = make_generator(engine)
    (traj,) = (await gen.generate([{"text": "apple"}])).trajectories
    assert traj.stop_reason == "error" and "engine down" in traj.error


async def test_on_rollout_end_hook_sees_every_episode(scripted_engine, register_skyrl_plugin):
    from skyrl_core import hookimpl

    seen = []

    class Observer:
        @hookimpl
        def on_rollout_end(self, trajectory):
            seen.append(trajectory.group_id)

    register_skyrl_plugin(Observer())
    engine = scripted_engine(default="<answer>x</answer>")
    await make_generator(engine, n_samples_per_prompt=2, max_turns=1).generate([{"text": "a"}, {"text": "b"}])
    assert sorted(seen) == ["0", "0", "1", "1"]


def test_template_without_eos_is_rejected(scripted_engine):
    engine = scripted_engine()
    with pytest.raises(ValueError, match="end_of_turn_token_id"):
        ChatRenderer(engine.tokenizer, end_of_turn_id=99999)


async def test_env_spec_stop_strings_reach_the_engine(scripted_engine, register_skyrl_plugin):
    from skyrl_core import EnvSpec, hookimpl

    class StopEnvPlugin:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="stop_env", entry_point="core_envs:CountdownEnv", stop=("</sql>",)))

    register_skyrl_plugin(StopEnvPlugin())
    engine = scripted_engine(default="done")
    gen = make_generator(engine, env_id="stop_env", stop=["</x>", "</sql>"])
    assert gen.sampling_params(8).stop == ["</x>", "</sql>"]
    assert make_generator(engine, env_id="stop_env").sampling_params(8).stop == ["</sql>"]


async def test_episode_stop_ends_an_episode_cleanly(scripted_engine):
    from skyrl_core.generator import EpisodeStop

    def out_of_budget(ids):
        raise EpisodeStop("token_budget", "tree budget spent")

    engine = scripted_engine("no tags", out_of_budget)
    (traj,) = (await make_generator(engine, max_turns=3).generate([{"text": "apple"}])).trajectories
    assert traj.stop_reason == "token_budget" and traj.error is None
    assert len(traj.turns) == 1 and sum(traj.loss_mask) == traj.turns[0].generated_tokens


async def test_env_metrics_are_averaged_into_the_batch_metrics(scripted_engine, test_envs):
    engine = scripted_engine("go", "done", "done")
    batch = await make_generator(engine, env_id="countdown", max_turns=3).generate([{"n": 1}, {"n": 2}])
    assert [t.metrics["turns_seen"] for t in batch] == [2.0, 1.0]
    assert batch.metrics["env/turns_seen"] == 1.5


class SeedRecorder:
    """Wraps a scripted engine: records ``(arrival, seed)`` of every request, after a random delay."""

    def __init__(self, engine, jitter=0.003):
        import random

        self.engine, self.tokenizer, self.jitter = engine, engine.tokenizer, jitter
        self.random = random.Random()  # unseeded: arrival order differs from run to run
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids, params):
        import asyncio

        await asyncio.sleep(self.random.random() * self.jitter)
        self.seeds.append(params.seed)
        return await self.engine.generate(prompt_ids, params)

    async def update_weights(self, named_tensors):
        pass


TASKS = [{"id": "a", "text": "apple"}, {"id": "b", "text": "pear"}, {"id": "c", "text": "kiwi"}]


def expected_seeds(seed, turns=2, samples=3, ids="abc"):
    from skyrl_core.generator import request_seed

    return {request_seed(seed, f"{i}/{s}/t{t}") for i in ids for s in range(samples) for t in range(turns)}


async def test_requests_are_seeded_by_their_place_in_the_batch_not_by_arrival(scripted_engine):
    # reverse_text with a reply that never answers in the format: two turns per episode
    runs = {}
    for concurrency in (1, 64):
        engine = SeedRecorder(scripted_engine(default="no tags"))
        gen = make_generator(engine, n_samples_per_prompt=3, max_turns=2, max_concurrency=concurrency)
        batch = await gen.generate(TASKS, seed=7)
        assert all(len(t.turns) == 2 for t in batch)
        runs[concurrency] = engine.seeds
    # one episode at a time vs all at once with random delays: other arrival orders, the same seeds
    assert sorted(runs[1]) == sorted(runs[64])
    # one seed per (task, sample, turn): all distinct, and exactly request_seed(7, "<id>/<sample>/t<turn>")
    assert len(set(runs[1])) == len(runs[1]) == 18
    assert set(runs[1]) == expected_seeds(7)

    engine = SeedRecorder(scripted_engine(default="no tags"))
    gen = make_generator(engine, n_samples_per_prompt=3, max_turns=2, max_concurrency=64, seed=5)
    await gen.generate(TASKS, seed=8)
    assert set(engine.seeds) == expected_seeds(8) and not set(engine.seeds) & set(runs[1])
    engine.seeds.clear()
    await gen.generate(TASKS)  # no seed: the generator config's seed
    assert set(engine.seeds) == expected_seeds(5)


async def test_concurrent_batches_on_one_generator_keep_their_own_seeds(scripted_engine):
    import asyncio

    from skyrl_core.generator import request_seed

    engine = SeedRecorder(scripted_engine(default="no tags"))
    gen = make_generator(engine, max_turns=2)
    await asyncio.gather(gen.generate(TASKS[:1], seed=1), gen.generate(TASKS[1:2], seed=2))
    assert set(engine.seeds) == {request_seed(1, f"a/0/t{t}") for t in (0, 1)} | {
        request_seed(2, f"b/0/t{t}") for t in (0, 1)}
    assert gen.batch_seed == gen.config.seed  # outside a generate() call


def test_request_seed_is_a_stable_non_negative_63_bit_hash():
    from skyrl_core.generator import request_seed

    assert request_seed(0, "a/0/t0") == request_seed(0, "a/0/t0")
    assert request_seed(0, "a/0/t0") != request_seed(1, "a/0/t0") != request_seed(0, "a/0/t1")
    values = [request_seed(s, f"k{k}") for s in range(20) for k in range(20)]
    assert all(0 <= v < 2**63 for v in values) and len(set(values)) == len(values)
    assert request_seed(3, "step1") == 619651190738337453  # fixed: runs replay across versions


async def test_a_task_repeated_in_one_batch_samples_with_other_seeds(scripted_engine):
    from skyrl_core.generator import request_seed

    engine = SeedRecorder(scripted_engine(default="no tags"))
    gen = make_generator(engine, n_samples_per_prompt=2, max_turns=1)
    batch = await gen.generate([TASKS[0], TASKS[1], TASKS[0]], seed=3)  # e.g. a batch across an epoch end
    assert [(t.group_id, t.sample_index) for t in batch] == [("a", 0), ("a", 1), ("b", 0), ("b", 1),
                                                             ("a", 0), ("a", 1)]
    assert sorted(engine.seeds) == sorted(request_seed(3, f"{place}/{s}/t0")
                                          for place in ("a", "b", "a#1") for s in (0, 1))


class VersionedEngine:
    """Wraps a scripted engine: turn ``i``'s output says it came from policy version ``versions[i]``
    (a list: per-token ``weight_versions``; an int: ``metadata["weight_version"]``; None: nothing)."""

    def __init__(self, engine, versions):
        self.engine, self.tokenizer, self.versions = engine, engine.tokenizer, list(versions)

    async def generate(self, prompt_ids, params):
        out = await self.engine.generate(prompt_ids, params)
        version = self.versions.pop(0)
        if isinstance(version, list):
            out.weight_versions = (version * len(out.token_ids))[: len(out.token_ids)]
        elif version is not None:
            out.metadata["weight_version"] = version
        return out

    async def update_weights(self, named_tensors):
        pass


async def test_policy_versions_follow_the_engine_per_token_and_mark_observations(scripted_engine):
    scripted = scripted_engine("no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>")
    engine = VersionedEngine(scripted, [3, [3, 4], None])
    (traj,) = (await make_generator(engine, max_turns=3).generate([{"text": "apple"}])).trajectories
    assert traj.error is None and len(traj.policy_versions) == len(traj.response_ids)
    generated = [v for v, m in zip(traj.policy_versions, traj.loss_mask, strict=True) if m == 1]
    first, second, third = (len(o) for o in engine_outputs(scripted, scripted.tokenizer))
    assert generated == [3] * first + ([3, 4] * second)[:second] + [-1] * third
    assert all(v == -1 for v, m in zip(traj.policy_versions, traj.loss_mask, strict=True) if m == 0)
    assert traj.oldest_policy_version == 3

    engine = VersionedEngine(scripted, [None, None])
    scripted.enqueue("no tags here", "<answer>elppa</answer>")
    (unknown,) = (await make_generator(engine, max_turns=3).generate([{"text": "apple"}])).trajectories
    assert set(unknown.policy_versions) == {-1} and unknown.oldest_policy_version is None


async def test_step_wise_samples_slice_policy_versions_like_logprobs(scripted_engine):
    scripted = scripted_engine("no tags here", "<answer>elpap</answer>", "<answer>elppa</answer>")
    engine = VersionedEngine(scripted, [0, 1, [1, 2]])
    steps = (await make_generator(engine, max_turns=3, step_wise=True).generate([{"text": "apple"}])).trajectories
    assert [len(s.policy_versions) for s in steps] == [len(s.response_ids) for s in steps]
    assert [set(s.policy_versions) for s in steps] == [{0}, {1}, {1, 2}]
    assert [s.oldest_policy_version for s in steps] == [0, 1, 1]
