"""The GPU recipes (examples/configs/gpu_*.yaml, explained in docs/gpu.md), checked on a CPU.

Each recipe resolves through `skyrl run --config RECIPE --print-config` (a subprocess, as a user runs it)
to the layout docs/gpu.md describes, and passes the checks a run makes before it loads anything
(``FSDPGRPOTrainer.fit``: mode, engine placement, engine model). A misspelt key or a contradicting
option fails those same checks. Every `skyrl run --config ...` command written in docs/gpu.md or in a
recipe's header resolves and passes those checks (in-process, for time), and every config under
examples/configs/ is referenced from the docs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from skyrl_core.config import ResolvedConfig, build_config, env_run_defaults, load_yaml, merge, parse_overrides
from skyrl_core.factory import ConfigError
from skyrl_core.plugins import get_registry
from skyrl_trainers.engine_setup import engine_class, engine_config_for_policy
from skyrl_trainers.engines.vllm import VLLMEngine, VLLMEngineConfig
from skyrl_trainers.trainer import FSDPGRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
GPU_PAGE = ROOT / "docs" / "gpu.md"
SKYRL = Path(sys.executable).with_name("skyrl")

# What docs/gpu.md's table says of each recipe: the options that make its layout, and its GPUs.
RECIPES: dict[str, tuple[dict[str, dict[str, Any]], int]] = {
    "gpu_one_vllm.yaml": ({
        "trainer": {"device": "cuda", "precision": "bf16", "world_size": 1, "backend": "local",
                    "engine_placement": "in_process", "mode": "sync"},
        "engine": {"id": "vllm", "enable_sleep_mode": True, "replicas": 1},
    }, 1),
    "gpu_multi.yaml": ({
        "trainer": {"device": "cuda", "precision": "bf16", "world_size": 4, "backend": "local",
                    "engine_placement": "in_process", "mode": "sync"},
        "engine": {"id": "vllm", "enable_sleep_mode": True, "replicas": 1},
    }, 4),
    "gpu_ray.yaml": ({
        "trainer": {"device": "cuda", "precision": "bf16", "world_size": 4, "backend": "ray",
                    "engine_placement": "ray"},
        "engine": {"id": "vllm", "enable_sleep_mode": False, "replicas": 4, "tensor_parallel_size": 1},
        "run": {"ray_address": "auto"},
    }, 8),
}


def skyrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SKYRL), *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def preflight(path: Path, overrides: list[str] | None = None) -> ResolvedConfig:
    """The recipe resolved as `skyrl run --config` does, then the checks ``fit`` makes before it loads
    anything; returns the config (raises ConfigError where a run would stop)."""
    registry = get_registry()
    layers = [load_yaml(path), parse_overrides(overrides or [])]
    config = build_config(env_run_defaults(layers, registry), *layers, registry=registry)
    FSDPGRPOTrainer.check_config(config)
    return config


def gpus_needed(config: ResolvedConfig) -> int:
    """One GPU per trainer rank; engines placed on Ray take GPUs of their own, others share GPU 0."""
    trainer, engine = config.trainer, config.engine
    if trainer.engine_placement != "ray":
        return trainer.world_size
    return trainer.world_size + engine.replicas * engine.tensor_parallel_size


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_prints_the_layout_the_docs_describe(recipe):
    result = skyrl("run", "--config", str(CONFIGS / recipe), "--print-config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    expected, _ = RECIPES[recipe]
    for section, options in expected.items():
        assert {key: printed[section][key] for key in options} == options, section
    assert printed["env"]["id"] == "reverse_text" and printed["trainer"]["id"] == "fsdp_grpo"
    assert printed["trainer"]["model"].startswith("Qwen/Qwen2.5-")  # a real hub model, not a test one
    assert printed["trainer"]["off_policy"]["tis"] == "token"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_passes_the_checks_a_run_makes_before_loading(recipe):
    config = preflight(CONFIGS / recipe)
    assert engine_class(config) is VLLMEngine
    engine = engine_config_for_policy(config, seed=0)
    assert isinstance(engine, VLLMEngineConfig) and engine.model == config.trainer.model
    assert engine.max_model_len >= config.generator.max_context_length  # vLLM holds the longest context
    assert gpus_needed(config) == RECIPES[recipe][1]


@pytest.mark.parametrize(("recipe", "key", "typo", "hint"), [
    ("gpu_one_vllm.yaml", "gpu_memory_utilization", "gpu_memory_utilisation", "engine.gpu_memory_utilisation"),
    ("gpu_multi.yaml", "world_size", "world_sise", "trainer.world_sise"),
    ("gpu_ray.yaml", "ray_address", "ray_adress", "run.ray_adress"),
])
def test_a_misspelt_key_in_a_recipe_is_refused(recipe, key, typo, hint, tmp_path):
    text = (CONFIGS / recipe).read_text()
    assert len(re.findall(rf"^\s+{key}:", text, re.M)) == 1
    broken = tmp_path / recipe
    broken.write_text(re.sub(rf"^(\s+){key}:", rf"\1{typo}:", text, flags=re.M))
    result = skyrl("run", "--config", str(broken), "--print-config")
    assert result.returncode == 2 and result.stdout == ""
    assert f"{hint}: unknown key. Did you mean '{key}'?" in result.stderr
    with pytest.raises(ConfigError, match=f"{hint}: unknown key"):
        preflight(broken)


@pytest.mark.parametrize(("recipe", "overrides", "message"), [
    ("gpu_one_vllm.yaml", ["trainer.mode=one_step_off"], "engine.enable_sleep_mode=true frees the engine's memory"),
    ("gpu_ray.yaml", ["trainer.engine_placement=in_process"], "engine.replicas=4 runs each engine replica as a Ray "
                                                              "actor, but trainer.engine_placement=in_process"),
    ("gpu_multi.yaml", ["engine.model=Qwen/Qwen2.5-0.5B-Instruct"], "differs from trainer.model"),
])
def test_a_contradicting_option_fails_before_anything_loads(recipe, overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight(CONFIGS / recipe, overrides)
    # --print-config runs the same checks: it prints no config that would not start, and writes nothing
    result = skyrl("run", "--config", str(CONFIGS / recipe), "--print-config", f"run.output_dir={tmp_path / 'run'}",
                   *overrides)
    assert result.returncode == 2 and result.stdout == ""
    assert message in " ".join(result.stderr.split())
    assert list(tmp_path.iterdir()) == []


def documented_commands() -> list[str]:
    """The `skyrl run --config ...` commands of docs/gpu.md and of the recipes' headers (as typed, with
    any VAR=value prefix and trailing comment), one per line."""
    pattern = re.compile(r"^[#\s]*((?:[A-Z_]+=\S+\s+)*skyrl run --config .*)$")
    lines = GPU_PAGE.read_text().splitlines()
    for recipe in RECIPES:
        lines += (CONFIGS / recipe).read_text().splitlines()
    return [match.group(1) for line in lines if (match := pattern.match(line))]


def test_every_documented_command_resolves(skyrl_cli, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name the recipes from the repository root
    commands = documented_commands()
    for recipe in RECIPES:  # each recipe is shown with a command to run it
        assert any(f"--config examples/configs/{recipe}" in command for command in commands), recipe
    for command in dict.fromkeys(commands):
        words = [word for word in shlex.split(command, comments=True) if not re.fullmatch(r"[A-Z_]+=\S*", word)]
        assert words[:2] == ["skyrl", "run"], command
        args = words[2:] if "--print-config" in words else [*words[2:], "--print-config"]
        result = skyrl_cli("run", *args, env={"COLUMNS": "200"})  # in-process: the same code as the subprocess
        assert result.exit_code == 0, f"{command}\n{result.output}"
        printed = yaml.safe_load(result.stdout)
        overrides = [word for word in args if "=" in word and not word.startswith("-")]
        for override in overrides:
            assert merge(printed, parse_overrides([override])) == printed, f"{override} not applied: {command}"
        preflight(ROOT / args[args.index("--config") + 1], overrides)


def test_every_example_config_is_referenced_from_the_docs():
    docs = "\n".join(page.read_text() for page in sorted((ROOT / "docs").rglob("*.md")))
    configs = sorted(path.name for path in CONFIGS.glob("*.yaml"))
    assert set(RECIPES) <= set(configs)
    missing = [name for name in configs if f"examples/configs/{name}" not in docs]
    assert not missing, f"examples/configs/ files that no page of docs/ mentions: {missing}"
