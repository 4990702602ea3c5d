"""``engine.replicas``: several ``hf`` engines (``tiny-random`` on CPU), each a Ray actor, behind one client
that routes by load and session (:mod:`skyrl_trainers.engines.replicas`). A real local Ray, started once."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from skyrl_core import ray_cluster
from skyrl_core.engine import EngineError, SamplingParams
from skyrl_core.factory import ConfigError
from skyrl_trainers.engine_setup import build_engine
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.engines.replicas import RayEngineReplicas, ReplicaRouter, replica_config
from skyrl_trainers.engines.vllm import VLLMEngineConfig
from skyrl_trainers.models import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

CONFIG = HFEngineConfig(model="tiny-random", device="cpu", dtype="float32", max_batch_size=16, batch_wait_ms=20,
                        seed=7)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, seed=11, ignore_eos=True)
LONG = 2000  # tokens of a request that is still decoding seconds later (tiny-random decodes ~1-2 ms/token)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("another test left Ray running")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray_cluster.disconnect(True)


@pytest.fixture(scope="module")
def engine(local_ray):
    """Two replicas (one torch thread each), shared by the routing and weight tests."""
    replicas = RayEngineReplicas(HFEngine, CONFIG, 2, num_threads=1)
    yield replicas
    replicas.close()


def _perturbed(model, scale: float, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: t.detach() + scale * torch.randn(t.shape, generator=gen, dtype=t.dtype)
            for name, t in model.state_dict().items() if t.is_floating_point()}


async def _all(*calls):
    return await asyncio.gather(*calls)


async def _decodes(engine) -> list[int]:
    """Tokens each replica's engine has sampled so far (steps: every row of a step samples one)."""
    return await engine.remote_attr("sampling_steps")


async def _decoding(engine, before: list[int], replicas=(0, 1), timeout: float = 60.0) -> None:
    """Wait until each of ``replicas`` sampled a token after ``before`` (from :func:`_decodes`): its request
    is decoding, past the prefill (a decode that has only started may still take an update before it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        now = await _decodes(engine)
        if all(now[i] > before[i] for i in replicas):
            return
        assert asyncio.get_running_loop().time() < deadline, "the requests never started decoding"
        await asyncio.sleep(0.02)


def _served(engine) -> list[int]:
    return [s["served"] for s in engine.replica_stats()]


# ------------------------------------------------------------------------------------ routing, no Ray


def test_router_pins_a_session_to_the_least_loaded_replica_of_its_first_request():
    router = ReplicaRouter(3)
    alive = [True, True, True]
    assert [router.pick(None, alive) for _ in range(3)] == [0, 1, 2]  # one in flight on each
    router.finish(1, True)
    assert router.pick("a", alive) == 1  # least loaded now
    assert [router.pick("a", alive) for _ in range(3)] == [1, 1, 1]  # pinned, however loaded
    assert router.in_flight == [1, 4, 1]
    assert router.pick("b", alive) == 0 and router.pick(None, alive) == 2
    for i, served in ((0, True), (0, False), (2, None)):
        router.finish(i, served)
    assert (router.served, router.failed, router.in_flight) == ([1, 1, 0], [1, 0, 0], [0, 4, 1])
    assert router.pinned(1) == 1 and router.pinned(0) == 1


def test_router_forgets_the_least_recently_used_sessions_beyond_its_bound():
    router = ReplicaRouter(2, max_sessions=3)
    alive = [True, True]
    for session in ("s1", "s2", "s3"):
        router.pick(session, alive)
    router.pick("s1", alive)  # s1 used again: s2 is now the oldest
    router.pick("s4", alive)
    assert list(router.sessions) == ["s3", "s1", "s4"]
    for n in range(100):
        router.pick(f"x{n}", alive)
    assert len(router.sessions) == 3


def test_router_moves_the_sessions_of_a_dead_replica():
    router = ReplicaRouter(2)
    assert router.pick("a", [True, True]) == 0
    assert router.pick("a", [False, True]) == 1  # re-pinned to a live one
    assert router.pick("a", [True, True]) == 1
    assert router.forget(1) == 1 and not router.sessions
    with pytest.raises(EngineError, match="no live engine replica"):
        router.pick(None, [False, False])


def test_each_replica_gets_its_own_sampling_seed():
    assert [replica_config(CONFIG, i).seed for i in range(3)] == [7, 8, 9]
    assert replica_config(CONFIG, 1).model == CONFIG.model and replica_config(CONFIG, 0) is CONFIG
    assert replica_config(HFEngineConfig(), 1).seed is None  # nothing to offset
    assert replica_config({"seed": 3}, 1) == {"seed": 3}  # not a pydantic config: as is


# ------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("config_cls", [HFEngineConfig, VLLMEngineConfig])
def test_replicas_option(config_cls):
    assert config_cls().replicas == 1
    assert config_cls(replicas=4).replicas == 4
    assert "Ray actor" in config_cls.model_fields["replicas"].description
    with pytest.raises(ValidationError, match="replicas"):
        config_cls(replicas=0)


@pytest.mark.parametrize("placement", ["in_process", "process"])
def test_replicas_need_ray_placement(run_config, placement):
    from skyrl_trainers.trainer import FSDPGRPOTrainer

    cfg = run_config(trainer={"engine_placement": placement}, engine={"replicas": 2})
    with pytest.raises(ConfigError) as info:
        build_engine(cfg)
    assert "engine.replicas=2" in str(info.value) and f"trainer.engine_placement={placement}" in str(info.value)
    assert "trainer.engine_placement=ray" in str(info.value)
    with pytest.raises(ConfigError, match="engine.replicas=2"):
        FSDPGRPOTrainer(cfg).fit()
    assert not Path(cfg.run.output_dir).exists()  # refused before anything was written


# ------------------------------------------------------------------------------- two real replicas


def test_replicas_start_as_ray_actors_with_their_own_seeds(engine, local_ray):
    assert len(engine.replicas) == 2 and engine.config is CONFIG
    assert engine.tokenizer.encode("hello") == load_tokenizer("tiny-random").encode("hello")
    assert engine.weight_version == 0 and engine.in_flight_updates == "off"
    assert hasattr(engine, "release_memory") and not hasattr(engine, "sleep")
    assert [c.seed for c in asyncio.run(engine.remote_attr("config"))] == [7, 8]
    [group] = [g for g in local_ray.util.placement_group_table().values() if g["state"] == "CREATED"]
    assert group["strategy"] == "SPREAD" and list(group["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}]
    asyncio.run(engine.release_memory())  # reaches every replica
    assert [s["alive"] for s in engine.replica_stats()] == [True, True]


def test_sessions_spread_over_replicas_and_stay_on_theirs(engine):
    sessions = [f"episode-{i}" for i in range(8)]
    contexts = {s: [1, 20 + i, 30 + i] for i, s in enumerate(sessions)}
    where: dict[str, set[int]] = {s: set() for s in sessions}
    before = _served(engine)

    async def turn() -> None:  # every episode's next turn at once, as the generator sends them
        outs = await asyncio.gather(*(engine.generate(contexts[s], SamplingParams(max_tokens=3, seed=i, session_id=s))
                                      for i, s in enumerate(sessions)))
        for s, out in zip(sessions, outs, strict=True):
            where[s].add(out.metadata["replica"])
            contexts[s] = contexts[s] + out.token_ids + [5, 6]  # + an observation

    for _ in range(3):
        asyncio.run(turn())
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert Counter(next(iter(r)) for r in where.values()) == {0: 4, 1: 4}  # spread by load at the first turn
    assert [b + 12 for b in before] == _served(engine)
    assert [s["sessions"] for s in engine.replica_stats()] == [4, 4]

    # affinity beats load: 6 concurrent requests of one session all go to its replica
    pinned = next(iter(where["episode-0"]))
    outs = asyncio.run(_all(*(engine.generate(contexts["episode-0"], SamplingParams(
        max_tokens=2, seed=i, session_id="episode-0")) for i in range(6))))
    assert {o.metadata["replica"] for o in outs} == {pinned}


def test_requests_without_a_session_go_to_the_least_loaded_replica(engine):
    outs = asyncio.run(_all(*(engine.generate([1, 40 + i], SamplingParams(max_tokens=2, seed=i))
                                        for i in range(8))))
    assert Counter(o.metadata["replica"] for o in outs) == {0: 4, 1: 4}
    sessions_before = [s["sessions"] for s in engine.replica_stats()]

    async def one_busy_replica() -> tuple[int, list[int]]:
        long = SamplingParams(max_tokens=LONG, ignore_eos=True, seed=1)
        busy = asyncio.ensure_future(engine.generate([1, 2, 3], long))
        await asyncio.sleep(0)  # routed (and counted in flight) on its first step
        loads = [s["in_flight"] for s in engine.replica_stats()]
        assert sorted(loads) == [0, 1]
        short = []
        for i in range(4):
            short.append((await engine.generate([1, 50 + i], SamplingParams(max_tokens=2, seed=i))).metadata["replica"])
        assert not busy.done(), "the long request should still be decoding"
        return (await busy).metadata["replica"], short

    busy_replica, short = asyncio.run(one_busy_replica())
    assert short == [1 - busy_replica] * 4
    assert [s["sessions"] for s in engine.replica_stats()] == sessions_before  # session-less: nothing pinned
    assert [s["in_flight"] for s in engine.replica_stats()] == [0, 0]


def test_update_weights_puts_the_state_once_and_every_replica_loads_it(engine, local_ray, monkeypatch):
    reference = HFEngine(CONFIG)
    try:
        prompts = [[1, 20, 30, 40], [1, 7, 8]]
        before = [asyncio.run(r.generate(prompts[0], GREEDY)).token_ids for r in engine.replicas]
        assert before[0] == before[1]
        puts = []
        real_put = local_ray.put
        monkeypatch.setattr(local_ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
        version = engine.weight_version
        weights = _perturbed(reference.model, 0.5, seed=1)
        asyncio.run(engine.update_weights(weights))
        asyncio.run(reference.update_weights(weights))
        assert len(puts) == 1 and set(puts[0]) == set(weights)  # one object for all replicas
        assert engine.weight_version == version + 1
        assert [s["weight_version"] for s in engine.replica_stats()] == [version + 1] * 2
        expected = [asyncio.run(reference.generate(p, GREEDY)).token_ids for p in prompts]
        for replica in engine.replicas:  # the same weights: the same greedy tokens as the reference engine
            outs = [asyncio.run(replica.generate(p, GREEDY)) for p in prompts]
            assert [o.token_ids for o in outs] == expected
            assert [o.metadata["weight_version"] for o in outs] == [version + 1] * 2
        assert expected[0] != before[0]
        # through the router too, whichever replica serves
        assert asyncio.run(engine.generate(prompts[0], GREEDY)).token_ids == expected[0]
    finally:
        reference.close()


def test_replicas_that_disagree_on_the_weight_version_are_an_error(engine, tiny):
    version = engine.weight_version
    weights = {name: t.clone() for name, t in tiny[0].state_dict().items() if t.is_floating_point()}
    asyncio.run(engine.replicas[0].update_weights(weights))  # behind the client's back: one replica only
    disagree = f"disagree on weight_version.*replica 0: {version + 1}, replica 1: {version}"
    with pytest.raises(EngineError, match=disagree):
        _ = engine.weight_version
    asyncio.run(engine.replicas[1].update_weights(weights))
    assert engine.weight_version == version + 1


def test_engine_metrics_report_requests_per_replica(engine):
    metrics = engine.engine_metrics()
    stats = engine.replica_stats()
    assert metrics["engine/replicas_alive"] == 2.0
    for i in (0, 1):
        assert metrics[f"engine/replica{i}_requests"] == stats[i]["served"] > 0
        assert metrics[f"engine/replica{i}_failed"] == 0.0


def test_replicas_that_cannot_be_placed_or_built_are_refused(local_ray):
    groups = set(local_ray.util.placement_group_table())
    with pytest.raises(EngineError, match=r"engine.replicas=5 needs 5 x \{'CPU': 1.0\}.*'CPU': 4.0"):
        RayEngineReplicas(HFEngine, CONFIG, 5)
    with pytest.raises(EngineError, match=r"engine.replicas=2 needs 2 x \{'CPU': 1.0, 'GPU': 1.0\}.*'GPU': 0.0"):
        RayEngineReplicas(HFEngine, CONFIG, 2, num_gpus=1)
    failed = "(?s)HFEngine engine replica 0 failed to start in its Ray actor.*no-such-model-xyz"
    with pytest.raises(EngineError, match=failed):
        RayEngineReplicas(HFEngine, CONFIG.model_copy(update={"model": "no-such-model-xyz"}), 2, num_threads=1)
    new = [g for k, g in local_ray.util.placement_group_table().items() if k not in groups]
    assert [g["state"] for g in new] == ["REMOVED"]  # the failed start's group is gone (the refusals made none)
    assert local_ray.is_initialized()


# ------------------------------------------------------------------- in-flight updates, dead replicas


def test_in_flight_updates_and_a_killed_replica(local_ray):
    config = CONFIG.model_copy(update={"in_flight_updates": "keep"})
    engine = RayEngineReplicas(HFEngine, config, 2, num_threads=1)
    reference = HFEngine(CONFIG)
    try:
        assert engine.in_flight_updates == "keep"
        params = [SamplingParams(max_tokens=1200, ignore_eos=True, seed=i, session_id=f"s{i}") for i in range(2)]

        async def update_mid_decode():
            before = await _decodes(engine)
            pending = [asyncio.ensure_future(engine.generate([1, 2, 3 + i], params[i])) for i in range(2)]
            await _decoding(engine, before)
            assert not any(p.done() for p in pending)
            await engine.update_weights(_perturbed(reference.model, 0.5, seed=2))
            return await asyncio.gather(*pending)

        outs = asyncio.run(update_mid_decode())
        assert sorted(o.metadata["replica"] for o in outs) == [0, 1]
        for out in outs:  # each replica took the update between two decode steps
            assert out.weight_versions[0] == 0 and out.weight_versions[-1] == 1
        assert engine.weight_version == 1

        # replica 1 dies while decoding: its request is sent again to the survivor, which answers it whole
        victim = outs[1].metadata["replica"]
        survivor = 1 - victim
        session = "s1"
        request = SamplingParams(max_tokens=LONG, ignore_eos=True, seed=3, session_id=session)

        async def kill_mid_decode():
            before = await _decodes(engine)
            pending = asyncio.ensure_future(engine.generate([1, 9], request))
            await _decoding(engine, before, [victim])
            assert not pending.done()
            local_ray.kill(engine.replicas[victim]._actor)
            return await asyncio.wait_for(pending, timeout=120)

        resent = asyncio.run(kill_mid_decode())
        assert resent.metadata["replica"] == survivor and len(resent.token_ids) == LONG
        stats = engine.replica_stats()
        assert stats[victim]["alive"] is False and stats[victim]["failed"] == 1 and stats[victim]["sessions"] == 0
        assert "replica" in stats[victim]["failure"] and stats[survivor]["sessions"] >= 1
        out = asyncio.run(asyncio.wait_for(engine.generate([1, 9], SamplingParams(
            max_tokens=3, seed=3, session_id=session)), timeout=60))
        assert out.metadata["replica"] == survivor  # the session moved
        asyncio.run(asyncio.wait_for(engine.update_weights(_perturbed(reference.model, 0.5, seed=3)), timeout=60))
        assert engine.weight_version == 2 and engine.engine_metrics()["engine/replicas_alive"] == 1.0
        asyncio.run(engine.release_memory())  # skips the dead replica

        local_ray.kill(engine.replicas[survivor]._actor)
        with pytest.raises(EngineError, match="died"):
            asyncio.run(asyncio.wait_for(engine.generate([1, 9], SamplingParams(max_tokens=3)), timeout=60))
        with pytest.raises(EngineError, match="all 2 HFEngine engine replicas are dead"):
            asyncio.run(engine.generate([1, 9], SamplingParams(max_tokens=3)))
        with pytest.raises(EngineError, match="all 2"):
            asyncio.run(engine.update_weights({}))
    finally:
        reference.close()
        engine.close()
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(engine.generate([1], SamplingParams(max_tokens=1)))
    assert local_ray.is_initialized()  # joined, not started, by the client: still running


# -------------------------------------------------------------------------------------- end to end


@pytest.fixture
def built_engines(monkeypatch):
    """The engines the trainer builds (kept, so a test can read their counters after the run)."""
    import skyrl_trainers.trainer as trainer_module

    built = []

    def build_and_keep(*args, **kwargs):
        engine, tokenizer = build_engine(*args, **kwargs)
        built.append(engine)
        return engine, tokenizer

    monkeypatch.setattr(trainer_module, "build_engine", build_and_keep)
    return built


def test_fsdp_grpo_trains_with_two_engine_replicas(run_config, local_ray, built_engines):
    from skyrl_trainers.trainer import FSDPGRPOTrainer
    from trainer_support import read_metrics

    # fp32 on both sides: the logprob gap then measures the weight sync alone, not bf16 rounding
    cfg = run_config(trainer={"steps": 2, "engine_placement": "ray", "export": False, "precision": "fp32"},
                     engine={"replicas": 2},
                     run={"seed": 5})
    groups_before = set(local_ray.util.placement_group_table())
    summary = FSDPGRPOTrainer(cfg).fit()
    assert summary["steps"] == 2
    [engine] = built_engines
    assert isinstance(engine, RayEngineReplicas) and engine.config.seed == 5
    stats = engine.replica_stats()
    assert all(s["served"] > 0 and s["failed"] == 0 for s in stats), stats
    # the initial sync and one update per step, in every replica
    assert [s["weight_version"] for s in stats] == [3, 3]
    records = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["train/logprob_gap_mean"] < 1e-3  # both replicas sample with the trainer's weights
    last = records[-1]
    assert last["engine/replicas_alive"] == 2.0
    assert [last[f"engine/replica{i}_requests"] for i in (0, 1)] == [s["served"] for s in stats]
    # the engine's actors and placement group are gone; the test's Ray is still up
    groups = {k: g for k, g in local_ray.util.placement_group_table().items() if k not in groups_before}
    assert [g["state"] for g in groups.values()] == ["REMOVED"]
    assert local_ray.is_initialized()


def test_async_training_updates_every_replica_in_flight(run_config, local_ray, built_engines):
    from skyrl_trainers.trainer import FSDPGRPOTrainer
    from trainer_support import read_metrics

    cfg = run_config(trainer={"steps": 3, "mode": "async", "off_policy": {"tis": "token"}, "engine_placement": "ray",
                              "export": False, "checkpoint_every": 0}, engine={"replicas": 2}, run={"seed": 6})
    summary = FSDPGRPOTrainer(cfg).fit()
    assert summary["steps"] == 3
    [engine] = built_engines
    assert engine.in_flight_updates == "keep"  # set off sync: updates land between decode steps on each replica
    stats = engine.replica_stats()
    assert all(s["served"] > 0 and s["failed"] == 0 for s in stats), stats
    assert stats[0]["weight_version"] == stats[1]["weight_version"] >= 3
    records = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["async/staleness_max"] <= 1.0 for r in records)
