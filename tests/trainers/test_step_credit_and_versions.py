"""One step's advantages and policy versions, each set in one place: samples.jsonl stores the advantages the
update trained on, and a token's policy version is the trainer's version the engine held when it was sampled."""

from __future__ import annotations

import json
from types import SimpleNamespace

from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.trajectory import Trajectory
from skyrl_trainers import trainer
from skyrl_trainers.async_metrics import PolicyVersions
from skyrl_trainers.config import FSDPGRPOConfig
from skyrl_trainers.overlap import OneStepOffLoop


class Ranks:
    """One rank that records the plans it is asked to train on."""

    world_size = 1

    def __init__(self) -> None:
        self.plans: list = []

    def call(self, name, per_rank=None):
        if name == "full_state_dict":
            return [{}]
        if name == "carries_prompts":
            return [True]
        self.plans.extend(per_rank)
        return [{"loss": 0.0, "tokens": 1.0, "optimizer_steps": 1.0}]


def test_samples_jsonl_stores_the_advantages_trained_on_computed_once(tmp_path, monkeypatch):
    calls = []
    assign = trainer.assign_advantages
    monkeypatch.setattr(trainer, "assign_advantages", lambda *a, **k: calls.append(1) or assign(*a, **k))
    batch = [Trajectory(id=f"e{i}", group_id=f"g{i // 3}", reward=float(i % 3 == 0) + 0.25 * i, prompt_ids=[9],
                        response_ids=[i, i], loss_mask=[1, 1], logprobs=[-0.1, -0.2],
                        error="sandbox died" if i == 4 else None) for i in range(6)]
    steps = object.__new__(trainer._StepLoop)  # the parts of the step loop that train and write samples
    steps.cfg = FSDPGRPOConfig(model="tiny-random", samples_per_step=6)
    steps.run_folder = SimpleNamespace(samples=tmp_path / "samples.jsonl")
    steps.workers, steps.credit, steps.groups = Ranks(), {}, {}

    steps.write_samples(3, batch)  # the order of both modes: samples first, then the update
    steps.train(3, batch)
    assert len(calls) == 1
    trained = {tuple(s.input_ids): s.advantage for plan in steps.workers.plans for mini in plan
               for micro in mini.micro_batches for s in micro}
    stored = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in stored] == [t.id for t in batch]
    for record in stored:
        key = (9, *record["response_ids"])
        if record["id"] == "e4":  # failed: left out of the loss and of the record
            assert "advantage" not in record["metrics"] and key not in trained
        else:
            assert record["metrics"]["advantage"] == trained[key] and record["metrics"]["train_step"] == 3.0
    assert len({r["metrics"].get("advantage") for r in stored}) > 2  # the values differ: a real comparison


class ReloadingEngine:
    """Counts its weight loads like the hf engine and stamps each reply with the count; after its first
    reply it awaits ``between_turns`` (the trainer finishing a step while the episode's env steps)."""

    def __init__(self, scripted, between_turns) -> None:
        self.scripted, self.tokenizer, self.between_turns = scripted, scripted.tokenizer, between_turns
        self.weight_version, self.replies = 0, 0

    async def generate(self, prompt_ids, params):
        out = await self.scripted.generate(prompt_ids, params)
        out.metadata["weight_version"] = self.weight_version
        self.replies += 1
        if self.replies == 1:
            await self.between_turns()
        return out

    async def update_weights(self, named_tensors) -> None:
        self.weight_version += 1


async def test_async_policy_versions_are_the_engines_weights_when_each_turn_was_sampled(scripted_engine):
    # a run resumed at step 5: the new engine counts from 0, the tokens still say "steps trained"
    scripted = scripted_engine("no tags here", "<answer>elppa</answer>")
    overlapped = None

    async def step_six_lands():
        await overlapped.push_weights(6, changed=True)

    engine = ReloadingEngine(scripted, step_six_lands)
    generator = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=1, max_turns=2), engine=engine,
                                   tokenizer=engine.tokenizer, env_id="reverse_text")
    steps = SimpleNamespace(cfg=FSDPGRPOConfig(model="tiny-random"), engine=engine, generator=generator, stream=None,
                            workers=Ranks(), seeded=False, versions=PolicyVersions(engine, 5),
                            trainer=SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(seed=0))))
    overlapped = OneStepOffLoop(steps)
    try:
        (traj,) = (await overlapped.generate([{"text": "apple"}], "task0")).trajectories
    finally:
        overlapped.close()
    first, second = traj.turns
    assert traj.error is None and engine.weight_version == 1
    assert traj.policy_versions == ([5] * first.generated_tokens + [-1] * first.observation_tokens
                                    + [6] * second.generated_tokens)
    assert traj.oldest_policy_version == 5


def test_sync_steps_count_the_policy_after_the_step_before_even_without_an_update():
    engine = SimpleNamespace(weight_version=1)  # after the run's first weight sync
    versions = PolicyVersions(engine, 0)
    seen = []
    for step, updated in ((1, True), (2, False), (3, True)):
        batch = [Trajectory(id="t", response_ids=[1, 2, 3], policy_versions=[engine.weight_version, -1,
                                                                             engine.weight_version])]
        versions.translate(batch)
        seen.append(batch[0].policy_versions)
        engine.weight_version += updated  # the weight sync after the update (none when no optimizer step ran)
        versions.pushed(step)
    assert seen == [[0, -1, 0], [1, -1, 1], [2, -1, 2]]
