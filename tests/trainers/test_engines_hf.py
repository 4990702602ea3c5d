"""The ``hf`` engine on the real tiny-random model: batching, sampling, logprobs, stops, weight sync."""

from __future__ import annotations

import asyncio
import copy
import itertools

import pytest
import torch
from skyrl_core.engine import EngineError, SamplingParams
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

GREEDY = SamplingParams(max_tokens=10, temperature=0)


@pytest.fixture
def engine(tiny):
    # packed_dtype=float32 throughout this file: logprobs equal the model's own forward to 1e-4 (the bf16
    # packing a bf16 CPU gets by default is tested in test_engines_hf_packed.py)
    model, tokenizer = tiny
    engine = HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(packed_dtype="float32", seed=0))
    yield engine
    engine.close()


def batching_engine(engine, size):
    """An engine on the same model that starts decoding only once ``size`` requests are in (or after 5 s),
    so a test's concurrent requests form one batch however slowly a loaded machine schedules them."""
    return HFEngine.from_model(engine.model, engine.tokenizer,
                               HFEngineConfig(packed_dtype="float32", max_batch_size=size, batch_wait_ms=5000))


def chat_prompts(tokenizer, n):
    """``n`` chat prompts of different lengths."""
    texts = [("reverse " + "apple river stone " * (i % 5)).strip() + f" #{i}" for i in range(n)]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for t in texts]


def teacher_forced_logprobs(model, prompt, response, temperature=1.0):
    """Log-probabilities a trainer would compute for ``response`` after ``prompt``."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)


def count_forwards(model):
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


async def test_requests_that_trickle_in_start_as_one_batch_when_each_arrival_restarts_the_wait(engine):
    """Six requests 0.4 s apart (as a client's samples arrive one HTTP request at a time) with a 1 s wait:
    a fixed window starts without the last ones; restarting the wait at each arrival gathers all six,
    unless batch_wait_max_ms caps the whole wait first."""
    prompts = chat_prompts(engine.tokenizer, 6)

    async def first_batch(max_wait_ms: float) -> int:
        trickled = HFEngine.from_model(engine.model, engine.tokenizer,
                                       HFEngineConfig(packed_dtype="float32", batch_wait_ms=1000, batch_wait_max_ms=max_wait_ms))
        calls = []
        for prompt in prompts:
            calls.append(asyncio.create_task(trickled.generate(prompt, GREEDY)))
            await asyncio.sleep(0.4)
        outputs = await asyncio.gather(*calls)
        trickled.close()
        assert all(len(o.token_ids) > 0 for o in outputs)
        return trickled.batch_sizes[0]

    assert await first_batch(max_wait_ms=60_000) == 6
    assert await first_batch(max_wait_ms=1500) < 6  # capped: the arrivals at 1.6 s and 2 s come too late
    assert await first_batch(max_wait_ms=0) < 6  # a fixed 1 s window from the first arrival


async def test_ignore_eos_decodes_past_eos_to_max_tokens(engine):
    eos = engine.tokenizer.eos_token_id
    seeded = [SamplingParams(max_tokens=96, temperature=1.0, seed=seed) for seed in range(16)]
    free = [await engine.generate([5, 17, 42], p) for p in seeded]
    assert any(o.stop_reason == "stop" and o.token_ids[-1] == eos for o in free)  # tiny-random ends some early
    past = [await engine.generate([5, 17, 42], p.model_copy(update={"ignore_eos": True})) for p in seeded]
    assert all(o.stop_reason == "length" and len(o.token_ids) == 96 for o in past)
    for stopped, going_on in zip(free, past, strict=True):  # the same tokens up to the EOS, then more
        assert going_on.token_ids[:len(stopped.token_ids)] == stopped.token_ids


async def test_a_cancelled_request_leaves_the_batch_and_the_others_decode_on(engine):
    prompts = chat_prompts(engine.tokenizer, 2)
    # ignore_eos: tiny-random would otherwise stop anywhere
    short = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    endless = SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True)
    alone = await engine.generate(prompts[0], short)
    together = batching_engine(engine, 2)
    forwards = count_forwards(engine.model)
    kept = asyncio.ensure_future(together.generate(prompts[0], short))
    doomed = asyncio.ensure_future(together.generate(prompts[1], endless))
    while len(forwards) < 5:
        await asyncio.sleep(0.01)
    doomed.cancel()
    out = await kept
    assert out.token_ids == alone.token_ids and len(out.token_ids) == 30  # the other row decoded on, unchanged
    await together.release_memory()  # runs once the batch's rows are all done
    assert len(forwards) < 750, f"{len(forwards)} forwards of 1500: the cancelled row went on decoding"
    assert doomed.cancelled()
    together.close()


async def test_sixteen_concurrent_requests_decode_as_one_batch_with_unbatched_results(engine):
    prompts = chat_prompts(engine.tokenizer, 16)
    alone = [await engine.generate(p, GREEDY) for p in prompts]
    batching = batching_engine(engine, 16)
    forwards = count_forwards(engine.model)
    together = await asyncio.gather(*(batching.generate(p, GREEDY) for p in prompts))
    assert batching.batch_sizes == [16] and batching.joined == 0
    assert len(forwards) <= GREEDY.max_tokens  # one prefill + one forward per further token, for all 16
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(o.token_ids) for o in together}) > 1  # the model answers prompts differently
    batching.close()


async def test_greedy_logprobs_are_the_models_own(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    out = await engine.generate(prompt, GREEDY)
    expected = teacher_forced_logprobs(engine.model, prompt, out.token_ids)
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


async def test_sampled_logprobs_follow_the_sampling_temperature(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    params = SamplingParams(max_tokens=12, temperature=0.7, seed=5)
    out = await engine.generate(prompt, params)
    expected = teacher_forced_logprobs(engine.model, prompt, out.token_ids, temperature=0.7)
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


async def test_raw_logprob_mode_reports_the_unscaled_model(tiny):
    model, tokenizer = tiny
    engine = HFEngine.from_model(model, tokenizer, HFEngineConfig(packed_dtype="float32", logprobs_mode="raw"))
    prompt = chat_prompts(tokenizer, 1)[0]
    out = await engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.7, top_k=5, seed=1))
    assert out.logprobs == pytest.approx(teacher_forced_logprobs(model, prompt, out.token_ids).tolist(), abs=1e-4)


async def test_top_k_one_is_greedy_with_certain_logprobs(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    greedy = await engine.generate(prompt, GREEDY)
    top1 = await engine.generate(prompt, SamplingParams(max_tokens=10, temperature=1.0, top_k=1))
    assert top1.token_ids == greedy.token_ids
    assert top1.logprobs == pytest.approx([0.0] * len(top1.token_ids), abs=1e-6)


async def test_top_p_restricts_sampling_to_the_nucleus(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_p=0.3, seed=s) for s in range(40)]
    firsts = {o.token_ids[0] for o in await asyncio.gather(*(engine.generate(prompt, p) for p in params))}
    with torch.no_grad():
        probs = torch.softmax(engine.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    ordered = probs.argsort(descending=True).tolist()
    nucleus = ordered[: int((probs[ordered].cumsum(0) < 0.3).sum()) + 1]
    assert firsts <= set(nucleus)


async def test_seeded_sampling_repeats_whatever_the_batch(engine):
    prompts = chat_prompts(engine.tokenizer, 6)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    alone = await engine.generate(prompts[0], params)
    batched = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    assert batched[0].token_ids == alone.token_ids
    other = await engine.generate(prompts[0], params.model_copy(update={"seed": 99}))
    assert other.token_ids != alone.token_ids


async def test_rows_finishing_one_by_one_keep_their_tokens_and_compact_the_cache_seldom(engine, monkeypatch):
    """Finished rows stay in the batch until half of it has finished: the others' tokens and logprobs
    are those of each request decoded alone, and the KV cache is compacted a few times, not per row."""
    from skyrl_trainers.engines import hf

    prompts = chat_prompts(engine.tokenizer, 8)
    params = [SamplingParams(max_tokens=2 + 3 * i, temperature=1.0, seed=50 + i) for i in range(8)]
    alone = [await engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
    # a delivered row's batch is compacted after the delivery: wait until that engine's decode thread is done,
    # or a loaded machine counts its last compaction below
    await engine.release_memory()
    compactions = []
    select = hf._Batch._select_live
    monkeypatch.setattr(hf._Batch, "_select_live",
                        lambda batch, device: compactions.append(len(batch.rows)) or select(batch, device))
    together = batching_engine(engine, len(prompts))  # one batch from the start, however loaded the machine
    try:
        batched = await asyncio.gather(*(together.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    finally:
        together.close()
    assert len({len(o.token_ids) for o in batched}) >= 6  # they leave at different steps
    for one, other in zip(alone, batched, strict=True):
        assert other.token_ids == one.token_ids
        assert other.logprobs == pytest.approx(one.logprobs, abs=1e-4)
    assert 1 <= len(compactions) <= 4  # 8 rows halve 8 -> 4 -> 2 -> 1 -> 0, instead of one copy per row


async def test_max_tokens_caps_the_output(engine):
    out = await engine.generate(chat_prompts(engine.tokenizer, 1)[0], SamplingParams(max_tokens=3, temperature=0))
    assert len(out.token_ids) == len(out.logprobs) == 3 and out.stop_reason == "length"


async def test_stop_token_ends_the_output_and_is_kept(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    full = await engine.generate(prompt, GREEDY)
    stop_id = full.token_ids[3]
    out = await engine.generate(prompt, GREEDY.model_copy(update={"stop_token_ids": [stop_id]}))
    cut = full.token_ids.index(stop_id) + 1
    assert out.token_ids == full.token_ids[:cut] and out.stop_reason == "stop"


async def test_eos_ends_the_output(engine):
    # Find a sampled completion that ends in EOS, then check it stopped right there.
    prompts = chat_prompts(engine.tokenizer, 8)
    params = [SamplingParams(max_tokens=64, temperature=1.0, seed=s) for s in range(8)]
    outs = await asyncio.gather(*(engine.generate(p, s) for p in prompts for s in params))
    eos = engine.tokenizer.eos_token_id
    stopped = [o for o in outs if o.stop_reason == "stop"]
    assert stopped, "expected at least one of 64 samples to end with EOS"
    assert all(o.token_ids[-1] == eos and eos not in o.token_ids[:-1] for o in stopped)
    assert all(o.stop_reason == "length" and len(o.token_ids) == 64 for o in outs if eos not in o.token_ids)


async def test_stop_string_ends_the_output_at_the_completing_token(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    full = await engine.generate(prompt, SamplingParams(max_tokens=20, temperature=0))
    decode = engine.tokenizer.decode
    # The stop string is the (plain-text) piece of the first token k >= 3 whose text is new so far.
    k, stop = next((k, decode([full.token_ids[k - 1]])) for k in range(3, 21)
                   if decode([full.token_ids[k - 1]]).isalpha()
                   and decode([full.token_ids[k - 1]]) not in decode(full.token_ids[:k - 1]))
    out = await engine.generate(prompt, SamplingParams(max_tokens=20, temperature=0, stop=[stop]))
    assert out.token_ids == full.token_ids[:k] and out.stop_reason == "stop" and out.text.endswith(stop)


async def test_bad_requests_fail_alone(engine):
    good = chat_prompts(engine.tokenizer, 1)[0]
    vocab = engine.model.config.vocab_size
    results = await asyncio.gather(
        engine.generate([], GREEDY), engine.generate([vocab + 5], GREEDY),
        engine.generate([1] * 2048, GREEDY), engine.generate(good, GREEDY), return_exceptions=True)
    assert isinstance(results[0], EngineError) and "empty" in str(results[0])
    assert isinstance(results[1], EngineError) and "outside the vocabulary" in str(results[1])
    assert isinstance(results[2], EngineError) and "context is 2048" in str(results[2])
    assert results[3].token_ids


async def test_generation_uses_new_weights_after_update(tiny):
    """Weight sync: after an optimizer step on the trainer's copy, the engine's logprobs move with it."""
    model, tokenizer = tiny
    trainer_model = copy.deepcopy(model).train()
    engine = HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(packed_dtype="float32"))
    prompt = chat_prompts(tokenizer, 1)[0]
    before = await engine.generate(prompt, GREEDY)
    response = before.token_ids
    # Push the trainer's policy away from this response (a step that lowers its log-likelihood).
    optimizer = torch.optim.SGD(trainer_model.parameters(), lr=1.0)
    ids = torch.tensor([prompt + response])
    logits = trainer_model(ids).logits[0, len(prompt) - 1:-1]
    torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).sum().backward()
    optimizer.step()
    trainer_after = teacher_forced_logprobs(trainer_model, prompt, response)
    assert sum(trainer_after) < sum(before.logprobs) - 1.0

    await engine.update_weights(trainer_model.state_dict())
    after = await engine.generate(prompt, GREEDY)
    assert engine.weight_version == 1 and after.metadata["weight_version"] == 1
    # What the engine now generates, and its logprobs, are the trainer's updated policy's.
    assert after.logprobs == pytest.approx(teacher_forced_logprobs(trainer_model, prompt, after.token_ids).tolist(),
                                           abs=1e-4)
    assert after.token_ids != before.token_ids or sum(after.logprobs) < sum(before.logprobs) - 1.0


async def test_bad_weight_updates_change_nothing(engine):
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    embed = "model.embed_tokens.weight"
    good = before[embed] + 1.0
    with pytest.raises(KeyError, match="model.embed_tokens.weight"):
        await engine.update_weights([(embed, good), ("model.embed_tokenz.weight", good)])
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        await engine.update_weights({embed: good, "model.norm.weight": torch.ones(3)})
    assert all(torch.equal(v, engine.model.state_dict()[k]) for k, v in before.items())
    assert engine.weight_version == 0


def test_engine_serves_successive_event_loops(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    first = asyncio.run(engine.generate(prompt, GREEDY))
    second = asyncio.run(engine.generate(prompt, GREEDY))
    assert first.token_ids == second.token_ids


def test_config_builds_engine_by_name_and_rejects_unknown_keys():
    engine = HFEngine(HFEngineConfig(packed_dtype="float32", model="tiny-random", device="cpu", max_batch_size=4))
    assert engine.tokenizer.eos_token == "<|im_end|>" and engine.device.type == "cpu"
    with pytest.raises(ValueError, match="max_batchsize"):
        HFEngineConfig(model="tiny-random", max_batchsize=4)


async def test_multi_turn_rollouts_keep_engine_tokens_and_logprobs(engine):
    generator = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=2, max_tokens_per_turn=16, max_turns=2),
                                   engine=engine, tokenizer=engine.tokenizer, env_id="reverse_text")
    batch = await generator.generate([{"text": "apple"}, {"text": "river stone"}])
    assert len(batch.trajectories) == 4
    for traj in batch.trajectories:
        assert traj.error is None
        assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
        generated = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m == 1]
        assert generated and all(lp < 0 for lp in generated)


async def test_closing_fails_waiting_requests_instead_of_hanging(tiny):
    model, tokenizer = tiny
    engine = HFEngine.from_model(model, tokenizer)
    prompts = chat_prompts(tokenizer, 4)
    tasks = [asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=200, temperature=0))) for p in prompts]
    await asyncio.sleep(0)  # the requests are queued
    engine.close()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
    assert all(isinstance(r, EngineError) and "closed" in str(r) for r in results)


@pytest.mark.slow  # converts the embedded model on a fresh machine (about 30 s, once per cache)
async def test_smollm2_answers_a_simple_question():
    engine = HFEngine(HFEngineConfig(model="smollm2-135m", device="cpu"))
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    out = await engine.generate(prompt, SamplingParams(max_tokens=24, temperature=0))
    assert "4" in out.text and out.stop_reason == "stop" and out.token_ids[-1] == engine.tokenizer.eos_token_id


async def test_samples_of_one_prompt_share_a_single_prefill(engine):
    prompts = chat_prompts(engine.tokenizer, 2)
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in range(4)]
    alone = [await engine.generate(p, s) for p in prompts for s in params]
    prefill_rows = []
    engine.model.register_forward_pre_hook(lambda _, args, kwargs: prefill_rows.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    batching = batching_engine(engine, 8)
    grouped = await asyncio.gather(*(batching.generate(p, s) for p in prompts for s in params))
    assert prefill_rows[0][0] == 2  # two distinct prompts prefilled, eight rows decoded
    assert prefill_rows[1][0] == 8 and prefill_rows[1][1] == 1
    assert [o.token_ids for o in grouped] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in grouped[:4]}) > 1  # different seeds, different samples
    batching.close()


async def test_weights_from_an_fsdp2_sharded_policy_are_gathered(tiny, tmp_path):
    """The colocated CPU path: the trainer's state dict holds DTensors from fully_shard (world size 1, gloo)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    model, tokenizer = tiny
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        policy = copy.deepcopy(model)
        with torch.no_grad():
            policy.model.norm.weight.mul_(3.0)
        for layer in policy.model.layers:
            fully_shard(layer)
        fully_shard(policy)
        state = policy.state_dict()
        assert type(state["model.norm.weight"]).__name__ == "DTensor"
        engine = HFEngine.from_model(copy.deepcopy(model), tokenizer)
        await engine.update_weights(state)
        assert torch.equal(engine.model.model.norm.weight, model.model.norm.weight * 3.0)
    finally:
        dist.destroy_process_group()


async def wait_until_decoding(engine):
    while not engine.batch_sizes:
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("newcomer_length", ["longer", "shorter"])
async def test_requests_join_a_running_batch_and_short_ones_return_first(engine, newcomer_length):
    tokenizer = engine.tokenizer
    words = {"longer": "apple river stone " * 12, "shorter": "hi"}[newcomer_length]
    first = chat_prompts(tokenizer, 1)[0]
    newcomer = tokenizer.apply_chat_template([{"role": "user", "content": words}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    long_params, short_params = SamplingParams(max_tokens=300, temperature=0), SamplingParams(max_tokens=8,
                                                                                              temperature=0)
    expected_long = await engine.generate(first, long_params)
    expected_short = await engine.generate(newcomer, short_params)
    engine.batch_sizes.clear()

    long_task = asyncio.create_task(engine.generate(first, long_params))
    await wait_until_decoding(engine)
    short = await engine.generate(newcomer, short_params)
    assert not long_task.done()  # the short request did not wait for the long one
    long = await long_task
    assert engine.joined == 1 and engine.batch_sizes == [1]
    assert short.token_ids == expected_short.token_ids and long.token_ids == expected_long.token_ids
    assert short.logprobs == pytest.approx(expected_short.logprobs, abs=1e-4)
    assert long.logprobs == pytest.approx(expected_long.logprobs, abs=1e-4)


async def test_a_join_drops_finished_rows_and_the_padding_they_leave_on_the_left(engine, tiny):
    """The longest row finishes first; when a request joins, the cache is rebuilt without it and without
    the padding every remaining row had only because of it, so the decode steps after the join attend
    over fewer positions, and every row still gets what it gets alone."""
    model, tokenizer = tiny
    long_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "apple river stone " * 20}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)
    short_prompt, newcomer = chat_prompts(tokenizer, 2)
    params = [SamplingParams(max_tokens=2, temperature=0), SamplingParams(max_tokens=400, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0)]
    alone = [await engine.generate(p, s) for p, s in zip((long_prompt, short_prompt, newcomer), params, strict=True)]
    widths = []  # the attention mask's width at each decode step
    joining = HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(packed_dtype="float32"))
    joining.model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["attention_mask"].shape[1])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    try:
        first = [asyncio.create_task(joining.generate(p, s)) for p, s in zip((long_prompt, short_prompt), params[:2], strict=True)]
        await first[0]  # the long prompt's row is done; the short one decodes on
        late = await joining.generate(newcomer, params[2])
        outputs = [await first[0], await first[1], late]
    finally:
        joining.close()
    assert joining.joins == 1
    # decode steps attend over one more position each, except where the join dropped the long prompt's padding
    drops = [before - after for before, after in itertools.pairwise(widths) if after < before]
    assert len(drops) == 1 and drops[0] > 20
    for one, other in zip(alone, outputs, strict=True):
        assert other.token_ids == one.token_ids
        assert other.logprobs == pytest.approx(one.logprobs, abs=1e-4)


async def test_weight_update_waits_for_rows_in_flight_and_applies_to_later_requests(engine, tiny):
    model, _ = tiny
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    params = SamplingParams(max_tokens=300, temperature=0)
    running = asyncio.create_task(engine.generate(prompt, params))
    await wait_until_decoding(engine)
    new_state = {k: v * 1.5 for k, v in model.state_dict().items()}
    update = asyncio.create_task(engine.update_weights(new_state))
    await asyncio.sleep(0)
    later = asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0)))
    before, _, after = await asyncio.gather(running, update, later)
    assert before.metadata["weight_version"] == 0 and after.metadata["weight_version"] == 1
    assert engine.joined == 0  # the later request did not join the batch decoding with the old weights


async def test_a_failing_forward_fails_its_batch_and_the_engine_keeps_serving(engine):
    prompts = chat_prompts(engine.tokenizer, 3)
    failures = []

    def fail_once(*_):
        if not failures:
            failures.append(1)
            raise RuntimeError("CUDA out of memory (simulated by a forward hook)")

    handle = engine.model.register_forward_hook(fail_once)
    results = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts), return_exceptions=True)
    handle.remove()
    assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)
    assert (await engine.generate(prompts[0], GREEDY)).token_ids


def test_roomy_cache_layer_appends_in_place_and_matches_a_plain_layer():
    from skyrl_trainers.engines.hf import _RoomyLayer
    from transformers.cache_utils import DynamicLayer

    generator = torch.Generator().manual_seed(0)
    plain, roomy = DynamicLayer(), DynamicLayer()
    prefill = torch.randn(4, 2, 5, 8, generator=generator), torch.randn(4, 2, 5, 8, generator=generator)
    plain.update(*prefill)
    roomy.update(*prefill)
    roomy.__class__ = _RoomyLayer
    pointers = []
    for step in range(12):
        rows = plain.keys.shape[0]
        new = torch.randn(rows, 2, 1, 8, generator=generator), torch.randn(rows, 2, 1, 8, generator=generator)
        expected, got = plain.update(*new), roomy.update(*new)
        assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
        pointers.append(roomy.keys.data_ptr())
        if step == 4:  # two rows leave the batch
            for layer in (plain, roomy):
                layer.batch_select_indices(torch.tensor([0, 2]))
        if step == 8:  # replaced from outside (as a merge does): moved to new buffers at the next update
            for layer in (plain, roomy):
                layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    # one buffer for the first steps, one after the selection, one after the replacement (counted as changes
    # between consecutive steps: a freed buffer's address may be handed out again later)
    assert sum(a != b for a, b in zip(pointers, pointers[1:], strict=False)) == 2


def test_a_stacked_layer_left_pads_each_part_with_zeros_and_appends_into_its_room():
    from skyrl_trainers.engines.hf import _RoomyLayer

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 2, 3, 4, generator=generator), torch.randn(1, 2, 5, 4, generator=generator)
    layer = _RoomyLayer.stacked([a, b], [a + 1, b + 1], width=6, room=2)
    assert layer.keys.shape == (3, 2, 6, 4) and layer.get_seq_length() == 6
    assert torch.equal(layer.keys[:2, :, 3:], a) and torch.equal(layer.keys[2:, :, 1:], b)
    assert torch.equal(layer.values[:2, :, 3:], a + 1) and torch.equal(layer.values[2:, :, 1:], b + 1)
    assert not layer.keys[:2, :, :3].any() and not layer.keys[2:, :, :1].any()  # padding: zeros, never garbage
    buffer = layer.keys.data_ptr()
    steps = [torch.randn(3, 2, 1, 4, generator=generator) for _ in range(3)]
    for new in steps[:2]:  # within the room: written in place
        layer.update(new, new)
        assert layer.keys.data_ptr() == buffer
    layer.update(steps[2], steps[2])  # past it: moved to a bigger buffer, nothing lost
    assert layer.keys.data_ptr() != buffer and layer.get_seq_length() == 9
    assert torch.equal(layer.keys[:, :, 6:], torch.cat(steps, dim=2)) and torch.equal(layer.keys[2:, :, 1:6], b)


async def test_sampled_rows_leaving_the_batch_at_different_steps_match_their_solo_runs(engine):
    prompts = chat_prompts(engine.tokenizer, 3)
    params = [SamplingParams(max_tokens=n, temperature=1.0, seed=10 + n) for n in (3, 9, 20, 14)]
    requests = [(prompts[i % 3], p) for i, p in enumerate(params)]
    alone = [await engine.generate(prompt, p) for prompt, p in requests]
    batching = batching_engine(engine, len(requests))
    together = await asyncio.gather(*(batching.generate(prompt, p) for prompt, p in requests))
    assert batching.batch_sizes == [len(requests)]
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_a_next_turn_runs_only_its_new_tokens_and_matches_a_full_prefill(engine, tiny, monkeypatch):
    """Turn 2's prompt is turn 1's prompt, its tokens and an observation: the engine continues turn 1's
    keys and values (one prefix hit each) and samples what a full prefill of that prompt would give.
    Neither turn's decode regrows its KV buffers: a prefill leaves room for its rows' whole decode."""
    import skyrl_trainers.engines.hf as hf

    regrown, with_room = [], hf._with_room
    monkeypatch.setattr(hf, "_with_room", lambda tensor, capacity: regrown.append(capacity) or with_room(tensor, capacity))
    prompts = chat_prompts(engine.tokenizer, 4)
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=7, ignore_eos=True)
    first = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    observation = engine.tokenizer.encode(" ok, and now?", add_special_tokens=False)
    second_prompts = [p + o.token_ids + observation for p, o in zip(prompts, first, strict=True)]
    second = await asyncio.gather(*(engine.generate(p, params) for p in second_prompts))
    assert engine.prefixes.hits == 4 and regrown == []
    model, tokenizer = tiny
    for prompt, out in zip(second_prompts, second, strict=True):
        assert out.logprobs == pytest.approx(teacher_forced_logprobs(model, prompt, out.token_ids), abs=1e-4)
    plain = HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(packed_dtype="float32", seed=0))
    try:
        again = await asyncio.gather(*(plain.generate(p, params) for p in second_prompts))
    finally:
        plain.close()
    assert plain.prefixes.hits == 0
    assert [o.token_ids for o in again] == [o.token_ids for o in second]


async def test_cached_prefixes_go_with_a_weight_update(engine):
    prompt = chat_prompts(engine.tokenizer, 1)[0]
    first = await engine.generate(prompt, GREEDY)
    assert engine.prefixes.entries
    await engine.update_weights(engine.model.state_dict())
    await engine.generate(prompt + first.token_ids + [first.token_ids[0]], GREEDY)
    assert engine.prefixes.hits == 0


async def test_cached_prefixes_stay_within_their_byte_budget(engine):
    """Long prompts from many clients cannot pile up keys and values: the oldest entries go first."""
    prompts = chat_prompts(engine.tokenizer, 6)
    await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    one_entry = max(prefix.bytes for prefix in engine.prefixes.entries.values())
    assert len(engine.prefixes.entries) == 6 and engine.prefixes.bytes == sum(
        prefix.bytes for prefix in engine.prefixes.entries.values())
    engine.prefixes.clear()
    engine.prefixes.max_bytes = 2 * one_entry
    await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    assert 1 <= len(engine.prefixes.entries) <= 2 and engine.prefixes.bytes <= 2 * one_entry
