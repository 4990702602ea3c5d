"""LoRA on fsdp_grpo (peft adapters on tiny-random): only adapters train and checkpoint, engines get the
merged weights, the export loads in peft and in plain transformers, bad settings name their field."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from skyrl_core.config import build_config
from skyrl_core.engine import SamplingParams
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry
from skyrl_trainers.batching import TrainSample, plan_step
from skyrl_trainers.config import FSDPGRPOConfig, LoRAConfig
from skyrl_trainers.engine_setup import shared_engine
from skyrl_trainers.engines.hf import HFEngine, HFEngineConfig
from skyrl_trainers.forward import collate, token_logprobs
from skyrl_trainers.models import build_tiny_random
from skyrl_trainers.run_folder import LORA_ADAPTER_FOLDER
from skyrl_trainers.trainer import FSDPGRPOTrainer
from skyrl_trainers.worker import WorkerSpec
from skyrl_trainers.workers import LocalWorkerGroup
from trainer_support import read_metrics

pytestmark = pytest.mark.usefixtures("one_cpu_thread")

ADAPTED = "model.layers.0.self_attn.q_proj.weight"  # a layer under an adapter with the default targets
PROMPT = [5, 6, 7, 8, 9]


def plan(seed, world_size=1):
    generator = torch.Generator().manual_seed(seed)
    batch = [TrainSample(torch.randint(10, 500, (9,), generator=generator).tolist(), 4, [1] * 5, [-3.0] * 5, a)
             for a in (1.0, -1.0, 0.5, 0.25)]
    return plan_step(batch, world_size=world_size, mini_batches=1, micro_batch_tokens=1000)


def lora_spec(**lora):
    # fp32: one rank (autocast) and two ranks (FSDP2's mixed precision) round bf16 differently, and these
    # tests compare them to 1e-6
    config = FSDPGRPOConfig(model="tiny-random", device="cpu", lr=1e-2, warmup_steps=3, kl_coef=0.05,
                            precision="fp32", lora=LoRAConfig(rank=4, **lora))
    return WorkerSpec(config, seed=0)


@pytest.fixture
def trained():
    """A LoRA rank after two updates (so the adapters are far from their zero start)."""
    group = LocalWorkerGroup(lora_spec())
    group.call("train_step", per_rank=plan(1))
    group.call("train_step", per_rank=plan(2))
    yield group.worker
    group.close()


def policy_logprobs(worker, prompt, response):
    sample = TrainSample(prompt + response, len(prompt), [1] * len(response), [0.0] * len(response), 0.0)
    with torch.no_grad():
        return token_logprobs(worker.policy, collate([sample]))[0][0].tolist()


def logits(model, ids=(PROMPT,)):
    with torch.no_grad():
        return model(torch.tensor(list(ids))).logits


def test_only_the_adapters_train_and_the_base_is_the_kl_reference():
    group = LocalWorkerGroup(lora_spec())
    worker = group.worker
    try:
        adapters = {n for n, p in worker.policy.named_parameters() if p.requires_grad}
        base_before = {k: v.clone() for k, v in worker.policy.state_dict().items() if ".lora_" not in k}
        adapters_before = {k: v.clone() for k, v in worker.policy.state_dict().items() if ".lora_" in k}
        first = group.call("train_step", per_rank=plan(1))[0]
        second = group.call("train_step", per_rank=plan(1))[0]
        state = worker.policy.state_dict()
        reference = policy_logprobs_without_adapters(worker)
    finally:
        group.close()
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    optimized = {id(p) for g in worker.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in worker.policy.named_parameters() if n in adapters}
    for key, value in base_before.items():
        assert torch.equal(state[key], value), key  # the frozen base is bit-identical after training
    assert any(not torch.equal(state[k], v) for k, v in adapters_before.items())
    # KL to the base: zero while the adapters are still at their zero start (B = 0), positive after an update
    assert first["kl_sum"] == 0.0 and second["kl_sum"] > 0
    plain, _ = build_tiny_random()
    assert reference == pytest.approx(teacher_forced(plain, PROMPT, [10, 11, 12]), abs=1e-6)


def policy_logprobs_without_adapters(worker):
    sample = TrainSample(PROMPT + [10, 11, 12], len(PROMPT), [1] * 3, [0.0] * 3, 0.0)
    with torch.no_grad():
        return token_logprobs(worker.ref_model, collate([sample]))[0][0].tolist()


def teacher_forced(model, prompt, response):
    out = torch.log_softmax(logits(model, [prompt + response])[0, len(prompt) - 1:-1], -1)
    return out.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


def test_checkpoints_hold_only_the_adapters_and_resume_exactly(tmp_path):
    import torch.distributed.checkpoint as dcp

    group = LocalWorkerGroup(lora_spec())
    try:
        group.call("train_step", per_rank=plan(1))
        group.call("save_checkpoint", str(tmp_path))
        second = group.call("train_step", per_rank=plan(2))[0]
        expected = {k: v.clone() for k, v in group.worker.policy.state_dict().items()}
    finally:
        group.close()
    saved = dcp.FileSystemReader(str(tmp_path / "shards")).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("model.") for k in saved if k.startswith("model.")}
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert all(".lora_" in k for k in saved if k.startswith("optim.state."))

    resumed = LocalWorkerGroup(lora_spec())
    try:
        resumed.call("load_checkpoint", str(tmp_path))
        again = resumed.call("train_step", per_rank=plan(2))[0]
        actual = resumed.worker.policy.state_dict()
    finally:
        resumed.close()
    assert again["lr_sum"] == second["lr_sum"]
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key
    for other in (FSDPGRPOConfig(model="tiny-random", device="cpu"), lora_spec(alpha=32).config):
        group = LocalWorkerGroup(WorkerSpec(other))
        try:
            with pytest.raises(ConfigError, match=r"trained with trainer\.lora rank=4, alpha=16\.0, "
                                                  r"target_modules='all-linear', but this run has"):
                group.call("load_checkpoint", str(tmp_path))
        finally:
            group.close()


def test_merged_weights_are_peft_merge_under_the_plain_names(trained):
    merged = trained.full_state_dict()
    reference = copy.deepcopy(trained.policy).merge_and_unload().state_dict()
    plain, _ = build_tiny_random()
    assert set(merged) == set(reference) == set(plain.state_dict())
    for key, value in reference.items():
        assert torch.allclose(merged[key], value, atol=1e-6), key
    assert not torch.equal(merged[ADAPTED], plain.state_dict()[ADAPTED])
    # the in-place view an in-process engine reads holds the same weights
    view = trained.model.state_dict()
    for key, value in merged.items():
        assert torch.equal(view[key], value), key


async def test_engines_generate_with_the_trained_policy_after_a_sync(trained):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    engine = HFEngine(HFEngineConfig(model="tiny-random", device="cpu", seed=0, packed_dtype="float32"))
    shared = shared_engine(trained, HFEngineConfig(model="tiny-random", device="cpu", seed=0, packed_dtype="float32"))
    try:
        await engine.update_weights(trained.full_state_dict())
        out = await engine.generate(PROMPT, params)
        expected = policy_logprobs(trained, PROMPT, out.token_ids)
        same = await shared.generate(PROMPT, params)
        # another update reaches the shared engine through the merged view, with no copy sent
        trained.train_step(plan(3)[0])
        await shared.update_weights({})
        moved = await shared.generate(PROMPT, params)
        moved_expected = policy_logprobs(trained, PROMPT, moved.token_ids)
    finally:
        engine.close()
        shared.close()
    assert out.logprobs == pytest.approx(expected, abs=1e-4)
    assert same.token_ids == out.token_ids and same.logprobs == pytest.approx(out.logprobs, abs=1e-5)
    assert moved.logprobs == pytest.approx(moved_expected, abs=1e-4)
    assert moved.logprobs != same.logprobs


def test_export_writes_an_adapter_and_a_merged_model_with_the_policys_logits(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trained.export(str(tmp_path))
    expected = logits(trained.policy)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path)
    base, _ = build_tiny_random()
    adapted = PeftModel.from_pretrained(base, tmp_path / LORA_ADAPTER_FOLDER)
    assert torch.allclose(logits(merged), expected, atol=1e-5)
    assert torch.allclose(logits(adapted), expected, atol=1e-5)
    assert {".lora_" in k for k in load_file(tmp_path / LORA_ADAPTER_FOLDER / "adapter_model.safetensors")} == {True}


@pytest.mark.parametrize(("lora", "message"), [
    ({"rank": -1}, r"trainer\.lora\.rank: .*greater than or equal to 0"),
    ({"alpha": 0}, r"trainer\.lora\.alpha: .*greater than 0"),
    ({"dropout": 1.0}, r"trainer\.lora\.dropout: .*less than 1"),
    ({"target_modules": []}, r"trainer\.lora\.target_modules: .*at least one non-empty module name"),
    ({"rnak": 8}, r"trainer\.lora\.rnak: unknown key\. Did you mean 'rank'"),
])
def test_bad_lora_settings_name_the_field(lora, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"env": {"id": "reverse_text"}, "trainer": {"id": "fsdp_grpo", "lora": lora}},
                     registry=get_registry())


def test_targets_that_match_no_layer_name_the_field():
    with pytest.raises(ConfigError, match=r"trainer\.lora\.target_modules: .*'q_prj'\. Did you mean 'q_proj'"):
        LocalWorkerGroup(lora_spec(target_modules=["q_prj"]))
    with pytest.raises(ConfigError, match=r"trainer\.lora\.target_modules="):
        LocalWorkerGroup(lora_spec(target_modules="nothing_matches_this"))


@pytest.mark.slow
def test_a_sharded_lora_policy_trains_like_one_rank_and_its_checkpoint_loads_on_one(tmp_path):
    from skyrl_trainers.workers import ProcessWorkerGroup

    group = ProcessWorkerGroup(lora_spec(), world_size=2)  # FSDP2: the frozen base and the adapters are sharded
    try:
        group.call("train_step", per_rank=plan(1, world_size=2))
        sharded = group.call("full_state_dict")[0]
        group.call("save_checkpoint", str(tmp_path))
        group.call("export", str(tmp_path / "export"))
    finally:
        group.close()
    single = LocalWorkerGroup(lora_spec())
    try:
        single.call("train_step", per_rank=plan(1))
        expected = single.call("full_state_dict")[0]
        expected_logits = logits(single.worker.policy)
    finally:
        single.close()
    resumed = LocalWorkerGroup(lora_spec())
    try:
        resumed.call("load_checkpoint", str(tmp_path))
        loaded = resumed.call("full_state_dict")[0]
    finally:
        resumed.close()
    assert not torch.equal(sharded[ADAPTED], build_tiny_random()[0].state_dict()[ADAPTED])
    for key, value in expected.items():
        assert torch.allclose(sharded[key], value, atol=1e-6), key
        assert torch.equal(loaded[key], sharded[key]), key
    from peft import PeftModel

    adapter = PeftModel.from_pretrained(build_tiny_random()[0], tmp_path / "export" / LORA_ADAPTER_FOLDER)
    assert torch.allclose(logits(adapter), expected_logits, atol=1e-5)


def test_a_lora_run_trains_resumes_and_exports(run_config, extra_envs):
    # an in-process hf engine shares the trainer's weights (through the merged view); activation
    # checkpointing works with a frozen embedding (whose output needs no gradient)
    # fp32: the logprob gap then measures the merged-view sync alone, not bf16 rounding
    trainer = {"lora": {"rank": 8, "alpha": 16}, "kl_coef": 0.01, "checkpoint_every": 1, "lr": 5e-3, "precision": "fp32",
               "gradient_checkpointing": True}
    cfg = run_config(env="letter_e", trainer={**trainer, "steps": 2})
    FSDPGRPOTrainer(cfg).fit()
    run_dir = Path(cfg.run.output_dir)
    FSDPGRPOTrainer(run_config(env="letter_e", trainer={**trainer, "steps": 3}, run={"resume": str(run_dir)})).fit()
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    # the engine sampled with the trainer's merged weights at every step
    assert all(r["train/logprob_gap_mean"] < 1e-3 for r in records), records
    exported = load_file(run_dir / "export" / "model.safetensors")
    initial = build_tiny_random()[0].state_dict()
    assert torch.equal(exported["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    assert not torch.equal(exported[ADAPTED], initial[ADAPTED])
    assert (run_dir / "export" / LORA_ADAPTER_FOLDER / "adapter_config.json").is_file()
    assert all(r["train/grad_norm"] > 0 for r in records[1:])


def test_a_lora_run_off_sync_sends_merged_weights_to_its_own_engine(run_config, extra_envs):
    cfg = run_config(env="letter_e", trainer={"lora": {"rank": 4}, "mode": "one_step_off", "steps": 3, "lr": 5e-3,
                                              "off_policy": {"tis": "token"}, "export": False, "precision": "fp32"})
    FSDPGRPOTrainer(cfg).fit()
    records = read_metrics(cfg.run.output_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    # step 1 trains on samples from the initial weights, which equal base + (B = 0): no gap
    assert records[0]["train/logprob_gap_mean"] < 1e-3


@pytest.mark.slow
def test_lora_grpo_learns_to_write_the_target_letter(run_config, extra_envs):
    # One seed's gain swings with rounding, and bf16 rounding differs between CPUs: seeds 0-3 gained 0.08,
    # 0.21, 0.09 and 0.29 by step 12 on one AVX512-BF16 machine, 0.06, 0.05, 0.11 and 0.13 on another. So the
    # test runs in fp32 and takes the mean over six seeds (0.22, 0.10, 0.11, 0.08, 0.13, 0.22; 3 s per seed).
    gains = []
    for seed in range(6):
        cfg = run_config(env="letter_e", generator={"n_samples_per_prompt": 8}, run={"seed": seed},
                         trainer={"steps": 12, "lr": 2e-2, "lora": {"rank": 8}, "export": False, "precision": "fp32"})
        FSDPGRPOTrainer(cfg).fit()
        rewards = [r["reward/mean"] for r in read_metrics(cfg.run.output_dir)]
        gains.append(sum(rewards[-2:]) / 2 - sum(rewards[:2]) / 2)
        shutil.rmtree(cfg.run.output_dir)
    assert sum(gains) / len(gains) > 0.1, gains
