"""``trainer.precision: auto``: bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere, always saying why."""

from __future__ import annotations

import pytest
from skyrl_trainers import precision
from skyrl_trainers.engine_setup import engine_config_for_policy
from skyrl_trainers.precision import cpu_bf16_feature, resolve_precision

CPUINFO = "processor\t: {n}\nmodel name\t: Some Xeon\nflags\t\t: fpu sse2 avx2 avx512f {extra}\n\n"


def cpuinfo(tmp_path, extra: str, name: str) -> str:
    path = tmp_path / name
    path.write_text("".join(CPUINFO.format(n=n, extra=extra) for n in range(2)))
    return str(path)


@pytest.mark.parametrize(("extra", "expected"), [
    ("avx512_bf16 amx_tile amx_bf16 amx_int8", "AMX"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512bw avx512vl", None),  # AVX512 without bf16 instructions: oneDNN would emulate bf16
])
def test_the_cpus_bf16_instructions_are_read_from_its_flags(tmp_path, extra, expected):
    assert cpu_bf16_feature(cpuinfo(tmp_path, extra, f"cpuinfo-{expected}")) == expected


def test_no_cpuinfo_means_no_bf16(tmp_path):
    assert cpu_bf16_feature(str(tmp_path / "absent")) is None


@pytest.mark.parametrize(("feature", "bf16", "reason"), [
    ("AMX", True, "this CPU has AMX; trainer.precision=fp32 turns it off"),
    (None, False, "this CPU has no native bf16"),
])
def test_auto_on_cpu_follows_the_hardware_and_says_why(monkeypatch, feature, bf16, reason):
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: feature)
    chosen = resolve_precision("auto", "cpu")
    assert chosen.bf16 is bf16
    assert reason in chosen.describe()
    assert chosen.describe().startswith("precision: bf16 mixed, fp32 master weights" if bf16 else "precision: fp32")


def test_explicit_choices_and_cuda_ignore_the_cpu(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: None)
    assert resolve_precision("bf16", "cpu").bf16 and resolve_precision("auto", "cuda").bf16
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: "AMX")
    assert not resolve_precision("fp32", "cpu").bf16


@pytest.mark.parametrize(("trainer_precision", "packed"), [("fp32", "float32"), ("bf16", "bfloat16"), ("auto", "auto")])
def test_the_engine_samples_in_the_trainers_precision(run_config, trainer_precision, packed):
    config = run_config(trainer={"precision": trainer_precision})
    assert engine_config_for_policy(config).packed_dtype == packed


def test_the_users_own_engine_choice_wins(run_config):
    config = run_config(trainer={"precision": "bf16"}, engine={"id": "hf", "packed_dtype": "float32"})
    assert engine_config_for_policy(config).packed_dtype == "float32"


def one_step(run_config, capsys) -> tuple[str, dict[str, float]]:
    from skyrl_trainers.trainer import FSDPGRPOTrainer
    from trainer_support import read_metrics

    cfg = run_config(trainer={"steps": 1, "export": False})
    FSDPGRPOTrainer(cfg).fit()
    return capsys.readouterr().out, read_metrics(cfg.run.output_dir)[0]


@pytest.mark.skipif(not cpu_bf16_feature(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)")
def test_a_default_run_on_a_bf16_cpu_trains_and_samples_in_bf16_with_tis(run_config, capsys):
    out, metrics = one_step(run_config, capsys)
    assert f"precision: bf16 mixed, fp32 master weights (auto: this CPU has {cpu_bf16_feature()}" in out
    assert "token-level TIS corrects them, because the trainer computes in bf16" in out
    # both sides round to bf16, so the rollout's logprobs are near but not equal to the trainer's, and TIS ran
    assert 1e-4 < metrics["train/logprob_gap_mean"] < 0.05
    assert metrics["train/is_ratio_mean"] == pytest.approx(1.0, abs=0.02)


def test_a_default_run_without_bf16_stays_fp32_and_exact(run_config, capsys, monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: None)
    out, metrics = one_step(run_config, capsys)
    assert "precision: fp32 (auto: this CPU has no native bf16" in out and "TIS" not in out
    assert metrics["train/logprob_gap_mean"] < 1e-3  # the engine shares the trainer's fp32 weights
    assert "train/is_ratio_mean" not in metrics  # tis auto resolved to none
