"""``trainer.precision: auto``: bf16 on CUDA and on CPUs whose bf16 matmuls are faster, fp32 elsewhere, always
saying why."""

from __future__ import annotations

import math

import pytest
import torch
from skyrl_trainers.engine_setup import engine_config_for_policy
from skyrl_trainers.engines.hf import resolve_packed_dtype
from skyrl_trainers.numerics import decide_numerics
from skyrl_trainers.precision import bf16_matmul_speedup, cpu_bf16_feature, resolve_precision

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


@pytest.mark.parametrize(("feature", "speedup", "bf16", "reason"), [
    ("AMX", 3.2, True, "this CPU has AMX, whose bf16 matmuls ran at 3.2x the fp32 rate here; "
                       "trainer.precision=fp32 turns it off"),
    ("AVX512-BF16", 2.1, True, "this CPU has AVX512-BF16, whose bf16 matmuls ran at 2.1x"),
    # the instructions are there, yet oneDNN's bf16 kernels run at half the fp32 rate (measured on such a Xeon)
    ("AVX512-BF16", 0.53, False, "this CPU has AVX512-BF16, but its bf16 matmuls ran at 0.53x the fp32 rate "
                                 "here; trainer.precision=bf16 forces bf16"),
    ("AVX512-BF16", 1.1, False, "ran at 1.10x the fp32 rate"),  # not clearly faster: fp32 is exact and as fast
    (None, 0.0, False, "this CPU has no native bf16"),
])
def test_auto_on_cpu_takes_bf16_only_where_it_measured_faster_and_says_why(this_cpu, feature, speedup, bf16,
                                                                           reason):
    probes = this_cpu(feature, speedup)
    chosen = resolve_precision("auto", "cpu")
    assert chosen.bf16 is bf16
    assert reason in chosen.describe()
    assert chosen.describe().startswith("precision: bf16 mixed, fp32 master weights" if bf16 else "precision: fp32")
    assert len(probes) == (1 if feature else 0)  # no instructions, no probe


def test_the_probe_runs_once_per_process_so_every_caller_agrees(this_cpu):
    probes = this_cpu("AVX512-BF16", 0.53)
    decisions = {resolve_precision("auto", "cpu").bf16 for _ in range(3)}
    assert decisions == {False} and resolve_packed_dtype("auto") == torch.float32  # the engine samples as it trains
    assert probes == [0.53]


def test_the_probe_measures_this_cpu_and_leaves_the_thread_count_alone():
    threads = torch.get_num_threads()
    speedup = bf16_matmul_speedup(size=256, rounds=3)
    assert math.isfinite(speedup) and speedup > 0
    assert torch.get_num_threads() == threads  # it times one core, then gives the run its threads back


def test_the_driver_hands_its_ranks_and_engine_a_decided_precision(this_cpu, run_config):
    this_cpu("AVX512-BF16", 0.53)
    decided, lines = decide_numerics(run_config(trainer={"precision": "auto"}))
    assert decided.trainer.precision == "fp32"
    assert lines[0].startswith("precision: fp32 (auto: this CPU has AVX512-BF16")
    # an engine built from it in another process (e.g. on Ray) packs as decided, without a probe of its own
    assert engine_config_for_policy(decided).packed_dtype == "float32"
    this_cpu("AMX", 3.0)
    decided = decide_numerics(run_config(trainer={"precision": "auto"}))[0]
    assert decided.trainer.precision == "bf16" and engine_config_for_policy(decided).packed_dtype == "bfloat16"
    assert decide_numerics(run_config(trainer={"precision": "fp32"}))[0].trainer.precision == "fp32"


def test_explicit_choices_and_cuda_ignore_the_cpu(this_cpu):
    probes = this_cpu(None)
    assert resolve_precision("bf16", "cpu").bf16 and resolve_precision("auto", "cuda").bf16
    this_cpu("AMX", 3.0)
    assert not resolve_precision("fp32", "cpu").bf16
    assert probes == []


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
def test_a_default_run_where_bf16_is_faster_trains_and_samples_in_bf16_with_tis(run_config, capsys, this_cpu):
    this_cpu(cpu_bf16_feature(), 2.0)  # real bf16 kernels; only the probe's verdict is given
    out, metrics = one_step(run_config, capsys)
    assert f"precision: bf16 mixed, fp32 master weights (auto: this CPU has {cpu_bf16_feature()}" in out
    assert "token-level TIS corrects them, because the trainer computes in bf16" in out
    # both sides round to bf16, so the rollout's logprobs are near but not equal to the trainer's, and TIS ran
    assert 1e-4 < metrics["train/logprob_gap_mean"] < 0.05
    assert metrics["train/is_ratio_mean"] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(("feature", "speedup", "said"), [
    (None, 0.0, "this CPU has no native bf16"),
    ("AVX512-BF16", 0.53, "this CPU has AVX512-BF16, but its bf16 matmuls ran at 0.53x"),
])
def test_a_default_run_where_bf16_is_not_faster_stays_fp32_and_exact(run_config, capsys, this_cpu, feature,
                                                                     speedup, said):
    this_cpu(feature, speedup)
    out, metrics = one_step(run_config, capsys)
    assert f"precision: fp32 (auto: {said}" in out and "TIS" not in out
    assert metrics["train/logprob_gap_mean"] < 1e-3  # the engine shares the trainer's fp32 weights
    assert "train/is_ratio_mean" not in metrics  # tis auto resolved to none
