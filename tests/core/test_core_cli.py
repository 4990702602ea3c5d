"""The skyrl CLI: plugins JSON, listings, check, rollout, run, and listing staying light."""

from __future__ import annotations

import json
import subprocess
import sys

from core_envs import ScriptedEnginePlugin, TestEnvsPlugin
from skyrl_core.trajectory import read_jsonl


def test_listing_tables_and_json(skyrl_cli, register_skyrl_plugin):
    register_skyrl_plugin(TestEnvsPlugin(), name="skyrl-test-envs", version="1.0")
    table = skyrl_cli("envs", env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "countdown" in table.output and "skyrl-test-envs 1.0" in table.output
    rows = {r["id"]: r for r in json.loads(skyrl_cli("envs", "--json").output)}
    assert rows["countdown"]["max_turns"] == 3 and rows["reverse_text"]["provider"] == "skyrl-reverse-text"
    engines = {r["id"] for r in json.loads(skyrl_cli("engines", "--json").output)}
    assert "openai" in engines
    generators = json.loads(skyrl_cli("generators", "--json").output)
    assert {"id": "default", "provider": "skyrl-core"}.items() <= generators[0].items()


def test_plugins_json_lists_hooks(skyrl_cli):
    plugins = json.loads(skyrl_cli("plugins").output)
    (reverse,) = [p for p in plugins if p["name"] == "skyrl-reverse-text"]
    assert reverse["hooks"] == ["register_envs", "register_probes"] and reverse["error"] is None
    assert any(p["name"] == "skyrl-core" for p in json.loads(skyrl_cli("plugins", "--all").output))


def test_listing_imports_no_heavy_module():
    code = ("import sys; from skyrl_core.cli import build_app; from typer.testing import CliRunner;"
            "r = CliRunner().invoke(build_app(), ['envs']); assert r.exit_code == 0, r.output;"
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'skyrl_reverse_text.env', 'httpx') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_check_passes_a_good_env_and_reports_each_check(skyrl_cli):
    result = skyrl_cli("check", "reverse_text")
    assert result.exit_code == 0
    assert "PASS  gold[row 1] (train-0)" in result.output and "PASS  action:huge" in result.output
    assert "0 failed" in result.output


def test_check_unknown_env_suggests(skyrl_cli):
    result = skyrl_cli("check", "revers_text")
    assert result.exit_code == 2 and "Did you mean 'reverse_text'?" in result.output


def test_rollout_writes_trajectories_and_prints_a_summary(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "--model", "llama3",
                       "--n-tasks", "3", "--samples", "2", "--out", str(out), "env.max_turns=1")
    assert result.exit_code == 0, result.output
    trajectories = list(read_jsonl(out))
    assert len(trajectories) == 6 and all(len(t.turns) == 1 for t in trajectories)
    assert "reward/mean" in result.output and "wrote 6 trajectories" in result.output


def test_rollout_bad_override_names_the_key(skyrl_cli, register_skyrl_plugin):
    register_skyrl_plugin(ScriptedEnginePlugin())
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "env.max_turnz=1")
    assert result.exit_code == 2 and "env.max_turnz: unknown key" in result.output


def test_rollout_bad_task_file_names_the_row(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"text": "abc"}\n[1, 2]\n')
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "--tasks", str(tasks))
    assert result.exit_code == 2 and "row 2 must be a JSON object" in result.output


def test_run_with_unknown_trainer_points_to_listing(skyrl_cli):
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpoo")
    assert result.exit_code == 2
    assert "unknown trainer id 'fsdp_grpoo'" in result.output and "skyrl trainers" in result.output


def test_plugins_can_add_commands(skyrl_cli, register_skyrl_plugin):
    from skyrl_core import hookimpl

    class Commands:
        @hookimpl
        def register_commands(self, cli):
            @cli.command("hello")
            def hello() -> None:
                """Say hello."""
                print("hello from a plugin")

    register_skyrl_plugin(Commands())
    assert skyrl_cli("hello").output.strip() == "hello from a plugin"


def test_rollout_takes_the_engine_from_the_config_file_unless_given(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    config = tmp_path / "run.yaml"
    config.write_text("engine: {id: scripted, model: llama3}\n")
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--config", str(config), "--n-tasks", "1",
                       "--out", str(out), "env.max_turns=1")
    assert result.exit_code == 0, result.output
    assert len(list(read_jsonl(out))) == 1
    result = skyrl_cli("rollout", "--env", "reverse_text", "--config", str(config), "--engine", "no_such_engine")
    assert result.exit_code == 2 and "no_such_engine" in result.output


def test_version_lists_core_and_each_plugin_distribution(skyrl_cli):
    from importlib import metadata

    result = skyrl_cli("--version")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"skyrl-core {metadata.version('skyrl-core')} (Python ")
    assert f"  skyrl-reverse-text {metadata.version('skyrl-reverse-text')}" in lines  # an installed plugin


def test_a_malformed_config_file_names_the_file_and_line(skyrl_cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  max_turns: 3\n trainer: {lr: 1\n")
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--config", str(config))
    assert result.exit_code == 2
    assert f"{config}:3:2: config file is not valid YAML" in result.output and "<unicode string>" not in result.output


def test_print_config_prints_the_resolved_yaml_and_builds_nothing(skyrl_cli, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--print-config",
                       "trainer.steps=7", "env.max_turns=1")
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert set(config) == {"env", "generator", "engine", "trainer", "run"}
    assert config["trainer"]["steps"] == 7 and config["trainer"]["lr"] == 1e-6  # an override and a default
    assert config["env"] == {**config["env"], "id": "reverse_text", "max_turns": 1}
    assert config["engine"]["id"] == "hf" and config["generator"]["id"] == "default"
    assert list(tmp_path.iterdir()) == []  # no run folder


def test_rollout_and_eval_print_their_config_without_an_engine(skyrl_cli, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    for command in ("rollout", "eval"):
        result = skyrl_cli(command, "--env", "reverse_text", "--engine", "no_engine_loaded_here", "--print-config",
                           "generator.max_tokens_per_turn=9")
        assert result.exit_code == 2 and "unknown engine id 'no_engine_loaded_here'" in result.output
        result = skyrl_cli(command, "--env", "reverse_text", "--print-config", "generator.max_tokens_per_turn=9")
        assert result.exit_code == 0, result.output
        config = yaml.safe_load(result.stdout)
        assert "trainer" not in config and config["generator"]["max_tokens_per_turn"] == 9
    assert list(tmp_path.iterdir()) == []


def test_run_without_env_or_trainer_names_the_flag(skyrl_cli):
    result = skyrl_cli("run", "--trainer", "fsdp_grpo")
    assert result.exit_code == 2 and "--env is required (see `skyrl envs`)" in result.output
    result = skyrl_cli("run", "--env", "reverse_text")
    assert result.exit_code == 2 and "--trainer is required (see `skyrl trainers`)" in result.output


def test_an_unknown_option_that_is_a_config_field_suggests_the_override(skyrl_cli):
    result = skyrl_cli("run", "--env", "reverse_text", "--steps", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "No such option: --steps" in result.output and "trainer.steps=2" in result.output
    result = skyrl_cli("eval", "--env", "reverse_text", "--max-turns=3", env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "env.max_turns=3" in result.output
    result = skyrl_cli("run", "--stepz", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "No such option: --stepz" in result.output and "=2" not in result.output
