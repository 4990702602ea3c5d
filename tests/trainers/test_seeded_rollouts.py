"""Rollouts are reproducible per seed on the real ``hf`` engine, whatever the batching, and resume replays."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.trajectory import TrajectoryBatch
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.trainer import FSDPGRPOTrainer, accepts_seed
from trainer_support import read_metrics

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

TASKS = [{"id": "a", "text": "apple"}, {"id": "b", "text": "river stone"}, {"id": "c", "text": "kiwi"}]


async def rollout(tiny, seed, concurrency, engine_seed):
    """Token ids per (group, sample) of one generate() call on a fresh engine."""
    model, tokenizer = tiny
    engine = HFEngine.from_model(copy.deepcopy(model), tokenizer, HFEngineConfig(seed=engine_seed))
    try:
        generator = MultiTurnGenerator(
            GeneratorConfig(n_samples_per_prompt=3, max_tokens_per_turn=8, max_turns=2, temperature=1.0,
                            max_concurrency=concurrency),
            engine=engine, tokenizer=tokenizer, env_id="reverse_text")
        batch = await generator.generate(TASKS, seed=seed)
    finally:
        engine.close()
    assert all(t.error is None for t in batch)
    return {(t.group_id, t.sample_index): t.response_ids for t in batch}


async def test_same_batch_seed_gives_the_same_tokens_whatever_the_batching(tiny):
    # one request at a time vs all 9 episodes batched together, on engines seeded differently: the
    # engine's own seed no longer matters because every request brings its seed
    one_by_one = await rollout(tiny, seed=3, concurrency=1, engine_seed=0)
    batched = await rollout(tiny, seed=3, concurrency=64, engine_seed=1)
    assert one_by_one == batched
    assert len({tuple(ids) for ids in batched.values()}) > 1  # samples of a task differ (temperature 1.0)
    other = await rollout(tiny, seed=4, concurrency=64, engine_seed=1)
    assert other.keys() == batched.keys() and other != batched


def test_the_trainer_passes_a_seed_only_to_generators_that_take_one():
    class Old:
        async def generate(self, tasks, n_samples=None): ...

    class Loose:
        async def generate(self, tasks, **options): ...

    assert not accepts_seed(Old()) and accepts_seed(Loose())
    assert accepts_seed(MultiTurnGenerator.__new__(MultiTurnGenerator))


class UnseededGenerator(MultiTurnGenerator):
    """A third-party generator written before ``generate(seed=...)`` existed."""

    async def generate(self, tasks, n_samples=None):
        return await super().generate(tasks, n_samples)


def test_a_generator_without_seed_still_trains_with_a_warning(run_config, extra_envs, register_skyrl_plugin,
                                                              caplog):
    from skyrl_core import GeneratorSpec, hookimpl

    class Plugin:
        @hookimpl
        def register_generators(self, register):
            register(GeneratorSpec(id="unseeded", entry_point="test_seeded_rollouts:UnseededGenerator",
                                   config=GeneratorConfig))

    register_skyrl_plugin(Plugin(), name="unseeded")
    with caplog.at_level(logging.WARNING, logger="skyrl_trainers.trainer"):
        FSDPGRPOTrainer(run_config(env="letter_e", generator={"id": "unseeded"},
                                   trainer={"steps": 1, "export": False})).fit()
    warnings = [r for r in caplog.records if "sampling is not reproducible" in r.getMessage()]
    assert len(warnings) == 1
    [record] = read_metrics(run_config().run.output_dir)
    assert record["rollout/episodes"] == 4.0


class SeedRecordingGenerator(MultiTurnGenerator):
    SEEDS: list[int | None] = []

    async def generate(self, tasks, n_samples=None, *, seed=None):
        self.SEEDS.append(seed)
        return await super().generate(tasks, n_samples, seed=seed)


def test_the_trainer_seeds_each_step_from_the_run_seed_and_the_step(run_config, extra_envs, register_skyrl_plugin):
    from skyrl_core import GeneratorSpec, hookimpl
    from skyrl_core.generator import request_seed

    class Plugin:
        @hookimpl
        def register_generators(self, register):
            register(GeneratorSpec(id="recording", entry_point="test_seeded_rollouts:SeedRecordingGenerator",
                                   config=GeneratorConfig))

    register_skyrl_plugin(Plugin(), name="recording")
    SeedRecordingGenerator.SEEDS.clear()
    cfg = run_config(env="letter_e", generator={"id": "recording"}, trainer={"steps": 2, "export": False},
                     run={"seed": 11})
    FSDPGRPOTrainer(cfg).fit()
    assert SeedRecordingGenerator.SEEDS == [request_seed(11, "step1"), request_seed(11, "step2")]


def samples_by_step(run_dir: Path):
    return sorted((t.metrics["train_step"], t.group_id, t.sample_index, tuple(t.response_ids), t.reward,
                   tuple(t.policy_versions)) for t in TrajectoryBatch.from_jsonl(run_dir / "samples.jsonl"))


def test_a_resumed_run_replays_the_uninterrupted_run(run_config, extra_envs, tmp_path):
    trainer = {"steps": 4, "checkpoint_every": 1, "export": False, "samples_per_step": 8, "lr": 2e-2}
    generator = {"n_samples_per_prompt": 2, "max_tokens_per_turn": 6, "max_total_tokens": 6}
    straight = run_config(env="letter_e", generator=generator, trainer=trainer,
                          run={"output_dir": str(tmp_path / "straight")})
    FSDPGRPOTrainer(straight).fit()
    split = run_config(env="letter_e", generator=generator, trainer={**trainer, "steps": 2},
                       run={"output_dir": str(tmp_path / "split")})
    FSDPGRPOTrainer(split).fit()
    FSDPGRPOTrainer(run_config(env="letter_e", generator=generator, trainer=trainer,
                               run={"resume": str(tmp_path / "split")})).fit()

    a, b = samples_by_step(tmp_path / "straight"), samples_by_step(tmp_path / "split")
    assert {s[0] for s in a} == {1.0, 2.0, 3.0, 4.0}
    assert a == b
    # policy versions count steps trained, though the resumed run's engine counts its weight loads from 0 again
    assert {(s[0], v) for s in b for v in s[-1] if v >= 0} == {(step, step - 1) for step in (1.0, 2.0, 3.0, 4.0)}
    ra, rb = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "split")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2, 3, 4]
    for key in ("reward/mean", "rollout/response_tokens_mean", "train/loss", "train/grad_norm"):
        assert [r[key] for r in ra] == [r[key] for r in rb], key
    assert len({r["reward/mean"] for r in ra}) > 1  # the steps really sampled something different
