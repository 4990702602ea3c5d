"""``trainer.engine_placement``: the rollout engine in a spawned child process (or a Ray actor), behind the
same protocol as an in-process engine. Real child processes with ``tiny-random`` on CPU."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import signal

import pytest
import torch
from skyrl_core.engine import EngineError, SamplingParams
from skyrl_trainers.engine_setup import build_engine, can_share_weights, engine_class
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.engines.remote import ProcessEngine

CONFIG = HFEngineConfig(model="tiny-random", device="cpu", dtype="float32", max_batch_size=32, batch_wait_ms=50)
PROMPTS = [[1, 20, 30, 40], [1, 7, 8], [1, 99, 100, 101, 102, 103]]
PARAMS = SamplingParams(max_tokens=10, temperature=1.0, seed=1234)


class SleepyEngine:
    """A test engine whose generate never finishes (a request stays pending) and which has no tokenizer."""

    def __init__(self, config: object) -> None:
        self.config, self.tokenizer, self.weight_version = config, None, 0

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(3600)

    async def update_weights(self, named_tensors):
        self.weight_version += 1


class BrokenEngine:
    def __init__(self, config: object) -> None:
        raise ValueError(f"BrokenEngine rejects option {config!r}")


@pytest.fixture(scope="module")
def local_engine():
    engine = HFEngine(CONFIG)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def remote_engine():
    engine = ProcessEngine(HFEngine, CONFIG)
    yield engine
    engine.close()


async def _generate_all(engine, prompts=PROMPTS, params=PARAMS):
    return await asyncio.gather(*[engine.generate(p, params) for p in prompts])


def _perturbed(model, scale: float, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: t.detach() + scale * torch.randn(t.shape, generator=gen, dtype=t.dtype)
            for name, t in model.state_dict().items() if t.is_floating_point()}


def _same(a, b) -> None:
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        assert x.stop_reason == y.stop_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_process_engine_generates_like_the_in_process_engine(local_engine, remote_engine):
    assert remote_engine.pid != os.getpid() and remote_engine.pid in {p.pid for p in multiprocessing.active_children()}
    assert remote_engine.tokenizer.eos_token == local_engine.tokenizer.eos_token
    assert remote_engine.tokenizer.encode("hello") == local_engine.tokenizer.encode("hello")
    assert remote_engine.config is CONFIG
    assert remote_engine.weight_version == local_engine.weight_version == 0
    assert hasattr(remote_engine, "release_memory") and not hasattr(remote_engine, "sleep")
    _same(asyncio.run(_generate_all(remote_engine)), asyncio.run(_generate_all(local_engine)))
    asyncio.run(remote_engine.release_memory())  # forwarded to the child engine


def test_concurrent_requests_batch_inside_the_child(remote_engine):
    before = asyncio.run(remote_engine.remote_attr("batch_sizes"))
    prompts = [[1, 10 + i, 20 + i] for i in range(16)]
    outs = asyncio.run(_generate_all(remote_engine, prompts, SamplingParams(max_tokens=6, seed=5)))
    assert len(outs) == 16 and all(len(o.token_ids) >= 1 for o in outs)
    sizes = asyncio.run(remote_engine.remote_attr("batch_sizes"))[len(before):]
    # the 16 requests were decoded together in a few batches (the rest joined running ones), not one by one
    assert sizes and max(sizes) >= 4 and len(sizes) <= 8


def test_update_weights_goes_through_shared_memory_and_moves_the_version(local_engine):
    remote = ProcessEngine(HFEngine, CONFIG)
    local = HFEngine(CONFIG)
    try:
        base = asyncio.run(_generate_all(remote))
        for round_, seed in enumerate((1, 2), start=1):  # the second update reuses the child's shared buffers
            weights = _perturbed(local_engine.model, 0.5, seed)
            asyncio.run(remote.update_weights(weights))
            asyncio.run(local.update_weights(weights))
            assert remote.weight_version == round_ == local.weight_version
            updated = asyncio.run(_generate_all(remote))
            _same(updated, asyncio.run(_generate_all(local)))  # exactly the weights that were sent
            assert [o.metadata["weight_version"] for o in updated] == [round_] * len(PROMPTS)
        assert [o.token_ids for o in updated] != [o.token_ids for o in base]
        assert len(remote._shared) == len(weights)
        with pytest.raises(KeyError, match="no parameter"):  # the child's error reaches the caller
            asyncio.run(remote.update_weights({"nonexistent.weight": torch.zeros(2)}))
        assert remote.weight_version == 2
    finally:
        remote.close()
        local.close()


def test_a_killed_child_fails_pending_and_later_calls_quickly():
    engine = ProcessEngine(f"{__name__}:SleepyEngine", {"kind": "sleepy"})

    async def scenario():
        pending = asyncio.ensure_future(engine.generate([1, 2], PARAMS))
        await asyncio.sleep(0.3)
        assert not pending.done()
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="exited with code -9"):
            await asyncio.wait_for(pending, timeout=10)  # a pending call is failed, not left to hang
        with pytest.raises(EngineError, match="exited with code -9"):
            await asyncio.wait_for(engine.generate([1, 2], PARAMS), timeout=5)
        with pytest.raises(EngineError, match="exited with code -9"):
            await asyncio.wait_for(engine.update_weights({}), timeout=5)

    try:
        asyncio.run(scenario())
    finally:
        engine.close()


def test_close_ends_the_child_and_fails_later_calls():
    engine = ProcessEngine(f"{__name__}:SleepyEngine", {"kind": "sleepy"})
    pid = engine.pid
    asyncio.run(engine.update_weights({"w": torch.ones(3)}))
    assert engine.weight_version == 1
    engine.close()
    assert pid not in {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(engine.generate([1], PARAMS))
    engine.close()  # idempotent


@pytest.mark.parametrize("engine_cls, config, message", [
    (HFEngine, HFEngineConfig(model="no-such-model-xyz", device="cpu"), "hf engine: model 'no-such-model-xyz'"),
    (f"{__name__}:BrokenEngine", {"option": 7}, "ValueError: BrokenEngine rejects option {'option': 7}"),
])
def test_an_engine_that_fails_to_build_raises_the_childs_message(engine_cls, config, message):
    children = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(EngineError, match="failed to start in its process") as info:
        ProcessEngine(engine_cls, config)
    assert message in str(info.value)
    assert {p.pid for p in multiprocessing.active_children()} <= children


def test_placement_and_mode_decide_weight_sharing(run_config):
    cfg = run_config(trainer={"engine_placement": "in_process"})
    assert can_share_weights(cfg, engine_class(cfg))
    placed = run_config(trainer={"engine_placement": "process"})
    assert not can_share_weights(placed, engine_class(placed))
    engine, tokenizer = build_engine(placed, seed=3)
    try:
        assert isinstance(engine, ProcessEngine) and engine.config.seed == 3 and engine.config.model == "tiny-random"
        assert tokenizer is engine.tokenizer
    finally:
        engine.close()


def test_async_modes_never_share_weights(run_config):
    for mode in ("one_step_off", "async"):
        try:
            cfg = run_config(trainer={"mode": mode, "off_policy": {"tis": "token"}})
        except Exception as exc:  # noqa: BLE001 - the lead's off-policy config may still be settling
            pytest.skip(f"cannot build a {mode} config here: {exc}")
        assert not can_share_weights(cfg, engine_class(cfg))


def test_fsdp_grpo_trains_with_the_engine_in_a_child_process(run_config):
    from skyrl_trainers.trainer import FSDPGRPOTrainer
    from trainer_support import read_metrics

    # fp32 on both sides: the logprob gap then measures the weight sync alone, not bf16 rounding
    cfg = run_config(trainer={"steps": 2, "engine_placement": "process", "export": False, "checkpoint_every": 0,
                              "precision": "fp32"})
    children = {p.pid for p in multiprocessing.active_children()}
    summary = FSDPGRPOTrainer(cfg).fit()
    assert summary["steps"] == 2
    records = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        for key in ("reward/mean", "train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/logprob_gap_mean"):
            assert math.isfinite(record[key]), key
    assert records[0]["train/logprob_gap_mean"] < 1e-3  # the child engine samples with the trainer's weights
    assert {p.pid for p in multiprocessing.active_children()} <= children  # the engine process is gone


@pytest.mark.slow  # 12-25 s on 2 shared cores, mostly starting Ray
def test_ray_engine_generates_updates_and_fails_when_killed(local_engine):
    ray = pytest.importorskip("ray")
    from skyrl_trainers.engines.remote import RayEngine

    assert not ray.is_initialized()
    engine = RayEngine(HFEngine, CONFIG, num_cpus=2)
    try:
        assert engine.weight_version == 0 and engine.tokenizer.encode("hi") == local_engine.tokenizer.encode("hi")
        _same(asyncio.run(_generate_all(engine)), asyncio.run(_generate_all(local_engine)))
        outs = asyncio.run(_generate_all(engine, [[1, 10 + i] for i in range(16)], SamplingParams(max_tokens=4, seed=1)))
        assert len(outs) == 16
        assert max(asyncio.run(engine.remote_attr("batch_sizes"))) >= 2  # batched in the actor
        asyncio.run(engine.update_weights(_perturbed(local_engine.model, 0.5, 1)))
        assert engine.weight_version == 1
        assert [o.metadata["weight_version"] for o in asyncio.run(_generate_all(engine))] == [1] * len(PROMPTS)
        ray.kill(engine._actor)
        with pytest.raises(EngineError, match="Ray actor died"):
            asyncio.run(asyncio.wait_for(engine.generate([1, 2], PARAMS), timeout=30))
        with pytest.raises(EngineError, match="Ray actor died"):
            asyncio.run(engine.generate([1, 2], PARAMS))
    finally:
        engine.close()
    assert not ray.is_initialized()  # this client started Ray, so it shut it down
    with pytest.raises(EngineError, match="Ray actor died"):  # the failure outlives close()
        asyncio.run(engine.generate([1], PARAMS))
