"""In-flight weight updates on the ``hf`` engine (tiny-random): per-token policy versions, keep/recompute/off."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from skyrl_core.engine import SamplingParams
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.trajectory import TrajectoryBatch
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig, PackedLinears, packing_available

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

LONG = SamplingParams(max_tokens=40, temperature=0)
UPDATE_AFTER = 11  # forwards (the prefill, then 10 decode steps) before the update is queued


@pytest.fixture(scope="module")
def new_state(tiny):
    """A clearly different policy: every weight matrix moved by noise of 30% of its spread."""
    model, _ = tiny
    generator = torch.Generator().manual_seed(7)
    return {k: v + 0.3 * v.std() * torch.randn(v.shape, generator=generator) if v.dim() > 1 else v.clone()
            for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def new_model(tiny, new_state):
    model = copy.deepcopy(tiny[0])
    model.load_state_dict(new_state)
    return model


def make_engine(tiny, mode, **options):
    # float32 packing: each token's logprob equals a teacher-forced pass of its weight version to 1e-4
    model, tokenizer = tiny
    return HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(in_flight_updates=mode, packed_dtype="float32", **options))


def prompt_of(tokenizer, text):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def teacher_forced(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


class UpdateAfter:
    """Queues ``engine.update_weights(state)`` once the engine's model has run ``forwards`` forwards: the
    decode thread waits in a forward hook until the update is queued, so it lands at a known step
    whatever the machine's load. Also records the input length of every forward."""

    def __init__(self, engine, state, forwards=UPDATE_AFTER):
        self.engine, self.state, self.forwards = engine, state, forwards
        self.input_lengths: list[int] = []
        self.packed_layers: list[int] = []  # layers running on packed weights, at each forward
        self.reached = asyncio.Event()
        self.queued = threading.Event()
        self.loop = asyncio.get_running_loop()
        self.handle = engine.model.register_forward_hook(self.hook, with_kwargs=True)
        self.update: asyncio.Task | None = None
        self.outputs: list = []

    def hook(self, module, args, kwargs, output):
        self.input_lengths.append(kwargs["input_ids"].shape[1])
        self.packed_layers.append(sum("forward" in layer.__dict__ for layer in self.engine.packed.layers))
        if len(self.input_lengths) == self.forwards:
            self.loop.call_soon_threadsafe(self.reached.set)
            assert self.queued.wait(60), "the update was never queued"

    async def run(self, *requests):
        """``requests``: (prompt, params) pairs decoded together; returns their outputs once they and
        the update are done (the update's exception, if any, is raised)."""
        tasks = [asyncio.create_task(self.engine.generate(p, params)) for p, params in requests]
        await self.reached.wait()
        self.update = asyncio.create_task(self.engine.update_weights(self.state))
        await asyncio.sleep(0)  # the update is queued (its first step runs up to its await)
        self.queued.set()
        try:
            self.outputs = outputs = await asyncio.gather(*tasks)
            await self.update
        finally:
            self.handle.remove()
        return outputs

    @property
    def prefills(self) -> int:
        """Forwards over more than one token per row (prefills and re-prefills)."""
        return sum(n > 1 for n in self.input_lengths)


@pytest.fixture(scope="module")
def prompt(tiny):
    return prompt_of(tiny[1], "apple river stone " * 3)


@pytest.fixture(scope="module")
def old_greedy(tiny, prompt):
    """The old policy's greedy 40 tokens (the prompt is stop-free for both policies)."""
    engine = make_engine(tiny, "off")
    try:
        out = asyncio.run(engine.generate(prompt, LONG))
    finally:
        engine.close()
    assert len(out.token_ids) == LONG.max_tokens
    return out


@pytest.mark.parametrize("packed", [True, False])
async def test_recompute_update_lands_mid_request_and_each_token_is_its_versions(tiny, new_model, new_state,
                                                                                 prompt, old_greedy, packed):
    if packed and not packing_available():
        pytest.skip("this torch has no oneDNN linear packing")
    engine = make_engine(tiny, "recompute", packed_weights=packed)
    try:
        assert engine.in_flight_updates == "recompute" and engine.packed.enabled == packed
        trigger = UpdateAfter(engine, new_state)
        (out,) = await trigger.run((prompt, LONG))
    finally:
        engine.close()
    n, k = len(out.token_ids), UPDATE_AFTER - 1  # the update came before the UPDATE_AFTER-th token was sampled
    assert n == LONG.max_tokens and out.weight_versions == [0] * k + [1] * (n - k)
    assert out.metadata["weight_version"] == 0 and engine.weight_version == 1
    assert trigger.prefills == 2  # the prompt, then prompt + 10 tokens re-prefilled with the new weights
    # Packed weights were repacked in place: every forward, before and after the update, ran packed.
    assert set(trigger.packed_layers) == {len(engine.packed.layers) if packed else 0}
    assert out.token_ids[:k] == old_greedy.token_ids[:k]
    old_lp, new_lp = teacher_forced(tiny[0], prompt, out.token_ids), teacher_forced(new_model, prompt, out.token_ids)
    assert out.logprobs[:k] == pytest.approx(old_lp[:k].tolist(), abs=1e-4)
    assert out.logprobs[k:] == pytest.approx(new_lp[k:].tolist(), abs=1e-4)
    assert (old_lp[k:] - new_lp[k:]).abs().max() > 0.1  # the two policies really differ there
    assert out.token_ids[k:] != old_greedy.token_ids[k:]


async def test_keep_update_continues_the_row_on_its_old_cache(tiny, new_model, new_state, prompt, old_greedy):
    engine = make_engine(tiny, "keep")
    try:
        assert engine.in_flight_updates == "keep"
        trigger = UpdateAfter(engine, new_state)
        (out,) = await trigger.run((prompt, LONG))
    finally:
        engine.close()
    # The update came before the UPDATE_AFTER-th token, which is still sampled from the old weights' logits.
    n, k = len(out.token_ids), UPDATE_AFTER
    assert n == LONG.max_tokens and out.weight_versions == [0] * k + [1] * (n - k)
    assert out.metadata["weight_version"] == 0 and engine.weight_version == 1
    assert trigger.prefills == 1  # the row was never restarted nor re-prefilled
    assert out.token_ids[:k] == old_greedy.token_ids[:k]
    assert out.logprobs[:k] == pytest.approx(old_greedy.logprobs[:k], abs=1e-4)
    assert out.token_ids[k:] != old_greedy.token_ids[k:]  # the new weights decode the rest
    # ... over keys and values the old weights computed, so not what the new policy gives on the full prefix.
    new_lp = teacher_forced(new_model, prompt, out.token_ids)
    assert (torch.tensor(out.logprobs[k:]) - new_lp[k:]).abs().max() > 1e-3


async def test_off_update_waits_for_the_row_in_flight(tiny, new_state, prompt, old_greedy):
    engine = make_engine(tiny, "off")
    try:
        assert engine.in_flight_updates == "off"
        trigger = UpdateAfter(engine, new_state)
        (out,) = await trigger.run((prompt, LONG))
        after = await engine.generate(prompt, LONG)
    finally:
        engine.close()
    assert out.token_ids == old_greedy.token_ids and out.weight_versions == [0] * LONG.max_tokens
    assert out.logprobs == pytest.approx(old_greedy.logprobs, abs=1e-4)
    assert engine.weight_version == 1 and after.metadata["weight_version"] == 1
    assert set(after.weight_versions) == {1}


async def test_recompute_batch_of_sampled_rows_each_matches_its_versions(tiny, new_model, new_state):
    """Three sampled rows (two share a prompt, as a GRPO group does) decoding together when the update lands."""
    tokenizer = tiny[1]
    first, second = prompt_of(tokenizer, "apple river stone"), prompt_of(tokenizer, "count the stones " * 4)
    params = [SamplingParams(max_tokens=30, temperature=0.8, seed=s) for s in (1, 2, 3)]
    requests = [(first, params[0]), (first, params[1]), (second, params[2])]
    engine = make_engine(tiny, "recompute", max_batch_size=3, batch_wait_ms=5000)
    try:
        outputs = await UpdateAfter(engine, new_state).run(*requests)
    finally:
        engine.close()
    assert engine.batch_sizes == [3]
    k = UPDATE_AFTER - 1
    for (prompt, _), out in zip(requests, outputs, strict=True):
        n = len(out.token_ids)
        assert out.weight_versions == [0] * min(k, n) + [1] * (n - k)
        old_lp = teacher_forced(tiny[0], prompt, out.token_ids, temperature=0.8)
        new_lp = teacher_forced(new_model, prompt, out.token_ids, temperature=0.8)
        expected = torch.cat([old_lp[:k], new_lp[k:]])
        assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
    assert any(len(out.token_ids) > k for out in outputs)


async def test_an_in_flight_update_with_no_decode_running_applies_at_once(tiny, new_state, prompt, new_model):
    engine = make_engine(tiny, "keep")
    try:
        await engine.update_weights(new_state)
        assert engine.weight_version == 1
        out = await engine.generate(prompt, LONG)
    finally:
        engine.close()
    assert out.metadata["weight_version"] == 1 and set(out.weight_versions) == {1}
    assert out.logprobs == pytest.approx(teacher_forced(new_model, prompt, out.token_ids).tolist(), abs=1e-4)


async def test_a_bad_in_flight_update_fails_alone_and_the_row_goes_on(tiny, prompt, old_greedy):
    engine = make_engine(tiny, "recompute")
    try:
        trigger = UpdateAfter(engine, {"model.no_such.weight": torch.zeros(3)})
        with pytest.raises(KeyError, match="no_such"):
            await trigger.run((prompt, LONG))
        (out,) = trigger.outputs
        later = await engine.generate(prompt, LONG)  # the engine goes on with the old weights
    finally:
        engine.close()
    assert out.token_ids == old_greedy.token_ids and set(out.weight_versions) == {0} and engine.weight_version == 0
    assert trigger.prefills == 1  # a failed update changed nothing, so nothing was recomputed
    assert later.token_ids == old_greedy.token_ids and later.metadata["weight_version"] == 0


def test_packed_weights_follow_an_update_inside_a_decode(tiny, new_model, new_state, prompt):
    """What an in-flight update does to the packed copy: drop takes the stale forwards out, refresh repacks."""
    if not packing_available():
        pytest.skip("this torch has no oneDNN linear packing")
    model = copy.deepcopy(tiny[0]).eval()
    packed = PackedLinears(model)
    ids = torch.tensor([prompt])
    with torch.inference_mode(), packed:
        old = model(ids).logits
        packed.drop()
        assert not any("forward" in layer.__dict__ for layer in packed.layers)  # plain forwards meanwhile
        model.load_state_dict(new_state)
        packed.refresh()
        assert packed.weights is not None and all("forward" in layer.__dict__ for layer in packed.layers)
        new = model(ids).logits
    assert not any("forward" in layer.__dict__ for layer in packed.layers)
    with torch.no_grad():
        assert torch.allclose(new, new_model(ids).logits, atol=1e-4)
        assert not torch.allclose(old, new, atol=1e-2)
    packed.refresh()  # outside a decode: nothing is installed
    assert not any("forward" in layer.__dict__ for layer in packed.layers)


class UpdateBetweenTurns:
    """An engine wrapper that pushes new weights to the engine after its first turn."""

    def __init__(self, engine, state):
        self.engine, self.state, self.calls = engine, state, 0

    async def generate(self, prompt_ids, params):
        out = await self.engine.generate(prompt_ids, params)
        self.calls += 1
        if self.calls == 1:
            await self.engine.update_weights(self.state)
        return out

    async def update_weights(self, named_tensors):
        await self.engine.update_weights(named_tensors)


async def test_a_multi_turn_episode_spans_two_policy_versions(tiny, new_model, new_state, tmp_path):
    engine = make_engine(tiny, "keep")
    try:
        generator = MultiTurnGenerator(
            GeneratorConfig(n_samples_per_prompt=1, max_tokens_per_turn=24, max_turns=2, temperature=1.0),
            engine=UpdateBetweenTurns(engine, new_state), tokenizer=engine.tokenizer, env_id="reverse_text")
        batch = await generator.generate([{"text": "apple river"}], seed=3)
    finally:
        engine.close()
    (traj,) = batch.trajectories
    assert traj.error is None and len(traj.turns) == 2
    assert len(traj.policy_versions) == len(traj.response_ids) == len(traj.logprobs)
    first, second = traj.turns
    start2 = first.generated_tokens + first.observation_tokens
    assert traj.policy_versions == ([0] * first.generated_tokens + [-1] * first.observation_tokens
                                    + [1] * second.generated_tokens)
    assert traj.oldest_policy_version == 0
    turn1 = traj.response_ids[:first.generated_tokens]
    turn2 = traj.response_ids[start2:]
    assert traj.logprobs[:first.generated_tokens] == pytest.approx(
        teacher_forced(tiny[0], traj.prompt_ids, turn1).tolist(), abs=1e-4)
    context = traj.prompt_ids + traj.response_ids[:start2]
    assert traj.logprobs[start2:] == pytest.approx(teacher_forced(new_model, context, turn2).tolist(), abs=1e-4)
    assert (teacher_forced(tiny[0], context, turn2) - teacher_forced(new_model, context, turn2)).abs().max() > 0.1
    # samples.jsonl keeps the versions
    path = tmp_path / "samples.jsonl"
    batch.to_jsonl(path)
    (loaded,) = TrajectoryBatch.from_jsonl(path)
    assert loaded.policy_versions == traj.policy_versions and loaded.oldest_policy_version == 0
